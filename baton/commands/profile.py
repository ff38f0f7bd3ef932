"""``baton profile``: measure the engine's step time on this machine and write a cost model.

    baton profile --model default --out cost_model.json [--quick] [--threads 1] [--no-ray]

Times ``LLMEngine.step()`` over decode batches (B sequences at context L), prefill chunks (T tokens,
with and without prefix context) and mixed steps; fits step time on tokens, sampled rows, decode and
prefill attention work; measures the engine loop's overhead, a Ray call's round trip and the KV
transfer between two actors (``--no-ray`` skips the last two and uses the defaults or the flags).
The file (``baton.cost_model/1``) feeds ``python -m baton.perf.sim`` and ``baton plan``.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from pathlib import Path


def add_parser(sub) -> None:
    p = sub.add_parser(
        "profile",
        help="measure step times on this machine and write a cost model",
        description=__doc__.split("\n\n")[0],
    )
    # Defaults None (set in run()): --refit measures nothing, so it refuses the measuring flags, and
    # it can tell only that way that one was given.
    p.add_argument(
        "--model",
        default=None,
        help="default (SmolLM2-135M-Instruct), tiny, or a HF dir / .gguf path (default: default)",
    )
    p.add_argument("--out", default="cost_model.json", metavar="FILE", help="where to write the cost model")
    p.add_argument("--threads", type=int, default=None, help="torch threads (a CPU worker runs 1; default 1)")
    p.add_argument("--device", default=None, help="auto, cpu or cuda[:N] (default auto)")
    p.add_argument("--quick", action="store_true", help="a small grid (seconds): smoke tests, not planning")
    p.add_argument(
        "--no-ray", action="store_true", help="do not start Ray to measure the call round trip and the KV transfer"
    )
    p.add_argument(
        "--transfer-bandwidth-gbps",
        type=float,
        default=None,
        metavar="GB_S",
        help="KV transfer bandwidth in GB/s instead of measuring it (default without Ray: 0.65, "
        "gloo over loopback per docs/BENCHMARKS.md)",
    )
    p.add_argument(
        "--transfer-latency-ms", type=float, default=None, help="KV transfer fixed cost per chunk (default 5)"
    )
    p.add_argument(
        "--rpc-ms", type=float, default=None, help="router -> worker call round trip instead of measuring it"
    )
    p.add_argument(
        "--neighbour",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="measure how much slower steps run next to a busy worker on this host "
        "(default: on CPU, except with --quick)",
    )
    p.add_argument(
        "--kv-cache-gb",
        type=float,
        default=None,
        help="a serving worker's KV pool (default: as the engine sizes it, 2 GiB on CPU)",
    )
    p.add_argument(
        "--refit",
        default=None,
        metavar="FILE",
        help="measure nothing: fit FILE's stored samples again (current features) and write --out "
        "(only --out and --json go with it)",
    )
    p.add_argument("--json", action="store_true", help="print the cost model instead of a summary")
    p.set_defaults(run=run)


def _positive(name: str, v: float | None) -> None:
    if v is not None and not 0 < v < math.inf:
        raise ValueError(f"{name} must be a finite number > 0, got {v}")


def _non_negative(name: str, v: float | None) -> None:
    if v is not None and not 0 <= v < math.inf:  # (NaN fails both comparisons)
        raise ValueError(f"{name} must be a finite number >= 0, got {v}")


# The flags that say how to measure (all but --refit, --out and --json), and their defaults.
MEASURING = {
    "model": "default",
    "threads": 1,
    "device": "auto",
    "quick": False,
    "no_ray": False,
    "transfer_bandwidth_gbps": None,
    "transfer_latency_ms": None,
    "rpc_ms": None,
    "neighbour": None,
    "kv_cache_gb": None,
}
_DEVICE = re.compile(r"auto|cpu|cuda(:\d+)?")


def _flag(name: str, value) -> str:
    if name == "neighbour":
        return "--neighbour" if value else "--no-neighbour"
    return f"--{name.replace('_', '-')}"


def check_args(args: argparse.Namespace) -> None:
    """ValueError naming the flag, before anything is loaded or measured; fills in the defaults."""
    if args.refit:
        # (store_true flags default to False; the others to None: 0 and --no-neighbour count as given)
        given = [
            _flag(k, v)
            for k in MEASURING
            if (v := getattr(args, k)) is not None and not (v is False and MEASURING[k] is False)
        ]
        if given:
            raise ValueError(
                f"--refit measures nothing: {', '.join(given)} would be ignored (only --out and --json go with --refit)"
            )
        if not Path(args.refit).is_file():
            raise ValueError(f"--refit {args.refit}: no such file")
        return
    for name, default in MEASURING.items():
        if getattr(args, name) is None:
            setattr(args, name, default)
    from engine.config import max_num_threads

    _positive("--threads", args.threads)
    if args.threads > max_num_threads():
        raise ValueError(f"--threads must be at most {max_num_threads()} on this machine, got {args.threads}")
    if not _DEVICE.fullmatch(args.device):
        raise ValueError(f"--device must be auto, cpu, cuda or cuda:N, got {args.device!r}")
    _positive("--transfer-bandwidth-gbps", args.transfer_bandwidth_gbps)
    _positive("--kv-cache-gb", args.kv_cache_gb)
    _non_negative("--transfer-latency-ms", args.transfer_latency_ms)
    _non_negative("--rpc-ms", args.rpc_ms)


def run(args: argparse.Namespace) -> int:
    import json

    from baton.perf.profile.cost_model import CostModel, TransferModel
    from baton.perf.profile.run import ProfileOptions, refit, run_profile, summary
    from baton.perf.sim.cli import check_output_file

    check_output_file("--out", args.out)  # before the measurements, not after them
    check_args(args)
    if args.refit:
        cm = refit(CostModel.load(args.refit))
        cm.save(args.out)
        print(json.dumps(cm.to_json(), indent=1) if args.json else summary(cm))
        print(f"wrote {args.out}", file=sys.stderr)
        return 0

    transfer = None
    if args.transfer_bandwidth_gbps is not None or args.transfer_latency_ms is not None or args.no_ray:
        d = TransferModel()
        bw = args.transfer_bandwidth_gbps * 1e9 if args.transfer_bandwidth_gbps is not None else d.bandwidth_bytes_per_s
        lat = args.transfer_latency_ms / 1e3 if args.transfer_latency_ms is not None else d.latency_s
        given = args.transfer_bandwidth_gbps is not None or args.transfer_latency_ms is not None
        transfer = TransferModel(bw, lat, "flags" if given else "default (not measured)")
    opts = ProfileOptions(
        model=args.model,
        threads=args.threads,
        device=args.device,
        quick=args.quick,
        measure_ray=not args.no_ray,
        measure_neighbour=args.neighbour,
        transfer=transfer,
        rpc_s=args.rpc_ms / 1e3 if args.rpc_ms is not None else None,
        kv_cache_gb=args.kv_cache_gb,
    )
    cm = run_profile(opts, progress=lambda m: print(f"[profile] {m}", file=sys.stderr, flush=True))
    cm.save(args.out)
    print(json.dumps(cm.to_json(), indent=1) if args.json else summary(cm))
    print(f"wrote {args.out}", file=sys.stderr)
    return 0
