"""``baton bench ...``: offline throughput and scheduler overhead (serving benchmarks come later)."""

from __future__ import annotations

import argparse
import sys


def add_parser(sub) -> None:
    p = sub.add_parser("bench", help="benchmarks")
    bsub = p.add_subparsers(dest="bench", required=True, metavar="BENCH")

    o = bsub.add_parser("offline", help="offline throughput vs static batching and transformers")
    o.add_argument("--workload", default="anyscale-cpu", help="anyscale-cpu (64 requests) or anyscale-cpu-small")
    o.add_argument("--model", default="default", help="default, tiny, or a model path")
    o.add_argument("--n", type=int, default=None, help="number of requests (default: the workload's)")
    o.add_argument("--threads", type=int, default=None)
    o.add_argument("--max-num-batched-tokens", type=int, default=2048)
    o.add_argument("--skip-hf", action="store_true", help="only Baton's two modes")
    o.add_argument("--json", action="store_true")
    o.set_defaults(run=_offline)

    s = bsub.add_parser("scheduler", help="scheduler + batch preparation time per step (fake runner)")
    s.add_argument("--num-seqs", type=int, default=256)
    s.add_argument("--steps", type=int, default=400)
    s.add_argument("--json", action="store_true")
    s.set_defaults(run=_scheduler)


def _offline(args: argparse.Namespace) -> int:
    from bench.offline import WORKLOADS, format_table, run_offline, to_json

    if args.workload not in WORKLOADS:
        raise ValueError(f"unknown workload {args.workload!r}; choose one of {', '.join(WORKLOADS)}")
    if args.n is not None and args.n <= 0:
        raise ValueError(f"--n must be positive, got {args.n}")
    result = run_offline(args.workload, args.model, args.n, include_hf=not args.skip_hf, threads=args.threads,
                         max_num_batched_tokens=args.max_num_batched_tokens,
                         progress=lambda m: print(f"[bench] {m}", file=sys.stderr, flush=True))
    print(to_json(result) if args.json else format_table(result))
    return 0


def _scheduler(args: argparse.Namespace) -> int:
    from bench.scheduler_overhead import main

    return main(["--num-seqs", str(args.num_seqs), "--steps", str(args.steps)] + (["--json"] if args.json else []))
