"""The AVX2 builds of the CPU kernels against what they were before, in one process (same-run A/B,
the arms alternating so a slow spell of a shared machine falls on both). Every arm is built with
AVX-512 off (``-mno-avx512f`` after ``-march=native``), so on an AVX-512 host this measures what an
AVX2-only CPU of the same family would run.

- ``decode``: decode attention over every layer of a SmolLM2-shaped paged cache (30 layers, 9
  heads, 3 KV heads, head_dim 64), B sequences of L tokens: the 8-lane task against itself without
  reading a piece's rows ahead (``-DTOUCH_BYTES=0``) and against the 16-lane one
  (``-DWIDE_TASK=1``), the latter also without ``-fno-trapping-math`` (the build before both).
- ``silu``: SiLU * up over R rows of SmolLM2's 2 x 1,536 (a prefill step's rows, and a decode
  step's): the 8-lane loop (``exp_poly8``) against the scalar loop GCC vectorised before it
  (``-DSILU_SCALAR_LOOP=1``), and that loop without ``-fno-trapping-math`` (exp_poly's clamp then
  kept it scalar: the build before that).
- ``projections``: the GGUF-block kernel over all 120 SmolLM2 projections (the default model's
  own Q4_1 blocks) at 1 to 64 rows: the two-pass 3-row tile against the one-row tile (``-DMB=1``);
  also checks that both give the same floats. ``--arm=FLAGS`` adds a build of the kernel with
  those extra compiler flags (e.g. ``-DKC=384``), named by them (same floats not required).

    python -m bench.avx2_kernels [--parts decode,silu,projections] [--threads 2] [--repeats 7] [--json]
        [--arm=-DKC=384 ...]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Callable

AVX2 = ("-mno-avx512f",)
PARTS = ("decode", "silu", "projections")


def build(source: str, flags: tuple[str, ...]):
    """``source`` compiled with ``flags`` (cached), or an exit naming the flags and the reason."""
    from engine.native.build import build_and_load

    library = build_and_load(source, extra_flags=flags)
    if library.lib is None:
        raise SystemExit(f"{source} did not build with {' '.join(flags)}: {library.error}")
    return library


def alternate(arms: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Each arm's median seconds over ``repeats`` rounds, the arms taking turns within a round."""
    times: dict[str, list[float]] = {name: [] for name in arms}
    for name, run in arms.items():
        run()  # warm: page in, build any plan
    for _ in range(repeats):
        for name, run in arms.items():
            t = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - t)
    return {name: statistics.median(ts) for name, ts in times.items()}


def decode_part(seqs: int, context: int, repeats: int) -> dict:
    from bench.cpu_decode_kernel import smollm2_decode_inputs
    from engine.native.paged_decode import NativePagedDecode

    builds = {"8-lane task": AVX2, "8-lane, no read-ahead": (*AVX2, "-DTOUCH_BYTES=0"),
              "16-lane task": (*AVX2, "-DWIDE_TASK=1"),
              "16-lane, trapping math (before)": (*AVX2, "-DWIDE_TASK=1", "-ftrapping-math")}
    kernels = {name: NativePagedDecode(build("paged_decode.c", flags)) for name, flags in builds.items()}
    q, kv, tables, seq_lens = smollm2_decode_inputs(seqs, context)
    layers, head_dim = kv.shape[1], kv.shape[5]

    def every_layer(kernel):
        return lambda: [kernel(q, kv[:, n, 0], kv[:, n, 1], tables, seq_lens, head_dim**-0.5) for n in range(layers)]

    out = {name: k(q, kv[:, 0, 0], kv[:, 0, 1], tables, seq_lens, head_dim**-0.5) for name, k in kernels.items()}
    ms = {name: s * 1e3 for name, s in alternate({n: every_layer(k) for n, k in kernels.items()}, repeats).items()}
    base = out["8-lane task"]
    return {"seqs": seqs, "context": context, "ms": ms,
            "max_abs_diff": {n: float((o - base).abs().max()) for n, o in out.items()},
            "speed_up_over_before": ms["16-lane, trapping math (before)"] / ms["8-lane task"],
            "read_ahead_speed_up": ms["8-lane, no read-ahead"] / ms["8-lane task"]}


def silu_part(rows_list: list[int], repeats: int) -> dict:
    import torch

    from engine.native.layer_ops import NativeLayerOps, TorchLayerOps

    builds = {"8-lane vectors": ("-ffp-contract=off", *AVX2),
              "scalar loop (before)": ("-ffp-contract=off", *AVX2, "-DSILU_SCALAR_LOOP=1"),
              "scalar loop, trapping math": ("-ffp-contract=off", *AVX2, "-DSILU_SCALAR_LOOP=1", "-ftrapping-math")}
    ops = {name: NativeLayerOps(build("layer_ops.c", flags).lib) for name, flags in builds.items()}
    result = {}
    for rows in rows_list:
        gate_up = torch.randn(rows, 2 * 1536, generator=torch.Generator().manual_seed(rows)) * 4
        arms = {name: (lambda o=o: o.silu_mul(gate_up)) for name, o in ops.items()}
        arms["torch"] = lambda: TorchLayerOps.silu_mul(gate_up)
        ms = {name: s * 1e3 for name, s in alternate(arms, repeats).items()}
        result[str(rows)] = {"ms": ms, "speed_up_over_before": ms["scalar loop (before)"] / ms["8-lane vectors"]}
    return result


def projections_part(rows_list: list[int], repeats: int, extra_arms: tuple[str, ...] = ()) -> dict:
    import torch

    from engine.config import EngineConfig
    from engine.model_loader import load_model
    from engine.native.quant_linear import NativeQuantLinear

    model = load_model(EngineConfig(model="default", num_threads=torch.get_num_threads())).model
    projections = [p for layer in model.layers for p in layer.projections()]
    if any(p.quantized is None for p in projections):
        raise SystemExit("the default model's projections carry no GGUF blocks here (the quantized kernel did not load)")
    builds = {"3-row tile, two passes": AVX2, "1-row tile (before)": (*AVX2, "-DMB=1")}
    builds.update({arm: (*AVX2, *arm.split()) for arm in extra_arms})
    kernels = {name: NativeQuantLinear(build("quant_linear.c", flags).lib) for name, flags in builds.items()}
    result = {}
    for rows in rows_list:
        gen = torch.Generator().manual_seed(rows)
        xs = {k: torch.randn(rows, k, generator=gen) for k in {p.weight.shape[1] for p in projections}}

        def every_projection(kernel):
            return lambda: [kernel(xs[p.weight.shape[1]], p.quantized, p.bias) for p in projections]

        outs = {name: every_projection(k)() for name, k in kernels.items()}
        a, b = outs["3-row tile, two passes"], outs["1-row tile (before)"]
        ms = {name: s * 1e3 for name, s in alternate({n: every_projection(k) for n, k in kernels.items()}, repeats).items()}
        flop = sum(2 * rows * p.weight.shape[0] * p.weight.shape[1] for p in projections)
        result[str(rows)] = {"ms": ms, "gflop_s": {n: flop / (t / 1e3) / 1e9 for n, t in ms.items()},
                             "same_floats": all(torch.equal(x, y) for x, y in zip(a, b)),
                             "speed_up_over_before": ms["1-row tile (before)"] / ms["3-row tile, two passes"]}
    return result


def main(argv: list[str] | None = None) -> int:
    import torch

    p = argparse.ArgumentParser(prog="python -m bench.avx2_kernels", description=__doc__.split("\n\n")[0])
    p.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {', '.join(PARTS)}")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--seqs", default="8,32", help="decode: sequences (comma-separated)")
    p.add_argument("--context", type=int, default=200, help="decode: tokens per sequence")
    p.add_argument("--rows", default="1,3,8,32,64", help="projections: rows of x (comma-separated)")
    p.add_argument("--silu-rows", default="32,2048")
    p.add_argument("--arm", action="append", default=[], help="projections: another build, with these extra flags")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    parts = [part for part in args.parts.split(",") if part]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        p.error(f"unknown part(s) {', '.join(unknown)}; choose from {', '.join(PARTS)}")
    torch.set_num_threads(args.threads)
    report: dict = {"threads": args.threads, "repeats": args.repeats}
    if "decode" in parts:
        report["decode"] = [decode_part(int(s), args.context, args.repeats) for s in args.seqs.split(",")]
    if "silu" in parts:
        report["silu"] = silu_part([int(r) for r in args.silu_rows.split(",")], args.repeats)
    if "projections" in parts:
        report["projections"] = projections_part([int(r) for r in args.rows.split(",")], args.repeats, tuple(args.arm))
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    for d in report.get("decode", []):
        print(f"decode attention, {d['seqs']} x {d['context']} tokens, 30 layers: "
              + ", ".join(f"{n} {t:.1f} ms" for n, t in d["ms"].items()) + f"; {d['speed_up_over_before']:.2f}x over before, read-ahead {d['read_ahead_speed_up']:.2f}x")
    for rows, d in report.get("silu", {}).items():
        print(f"SiLU * up, {rows} rows: " + ", ".join(f"{n} {t:.2f} ms" for n, t in d["ms"].items())
              + f"; {d['speed_up_over_before']:.2f}x")
    for rows, d in report.get("projections", {}).items():
        print(f"120 projections, {rows} rows: " + ", ".join(f"{n} {t:.1f} ms ({d['gflop_s'][n]:.0f} GFLOP/s)"
                                                         for n, t in d["ms"].items())
              + f"; {d['speed_up_over_before']:.2f}x, same floats {d['same_floats']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
