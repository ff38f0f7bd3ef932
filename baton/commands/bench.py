"""``baton bench ...``: offline throughput, scheduler overhead, and the serving load generator (``serve``)."""

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
    o.add_argument(
        "--torch-path-baseline",
        action="store_true",
        help="also run (a) without the compiled CPU kernels (engine/native), as a same-run baseline",
    )
    o.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="run every system N times, rounds interleaved, and report each one's median run",
    )
    o.add_argument(
        "--speculative-tokens",
        type=int,
        default=0,
        metavar="K",
        help="also run (a) and (b) with n-gram drafts of up to K tokens, reported beside them",
    )
    o.add_argument(
        "--greedy-head-baseline",
        action="store_true",
        help="also run (a) and (b) computing every logit for greedy rows (the greedy head off)",
    )
    o.add_argument(
        "--amx-baseline",
        action="store_true",
        help="also run (a) and (b) with the layers' larger products off AMX (where the CPU has it)",
    )
    o.add_argument(
        "--tensor-parallel-size",
        type=int,
        default=1,
        metavar="N",
        help="Baton's engine sharded over N ranks (--threads each)",
    )
    o.add_argument("--json", action="store_true")
    o.set_defaults(run=_offline)

    i = bsub.add_parser("interference", help="colocated vs disaggregated on the same cores: ITL under long prompts")
    from baton.perf.interference_workload import add_arguments as _interference_arguments  # argparse only: cheap

    _interference_arguments(i)
    i.set_defaults(run=_interference)

    k = bsub.add_parser("kv-transfer", help="KV transfer throughput and latency between two actors")
    k.add_argument("--lengths", default="256,1024,4096", help="prompt lengths in tokens, comma-separated")
    k.add_argument("--repeats", type=int, default=5)
    k.add_argument("--chunk-tokens", type=int, default=2048, help="tokens a transfer chunk carries (default 2048)")
    k.add_argument("--device", default="cpu", help="cpu, or cuda (CUDA IPC on one GPU; NCCL too with two)")
    k.add_argument("--geometry", default="smollm2-135m", help="smollm2-135m, qwen2.5-0.5b or llama-3.2-1b")
    k.add_argument(
        "--dtype",
        default=None,
        choices=["float32", "bfloat16", "float16"],
        help="KV dtype (default: float32 on CPU, bfloat16 on CUDA)",
    )
    k.add_argument("--no-ray", action="store_true", help="peers in spawned processes instead of Ray actors")
    k.add_argument("--json", action="store_true")
    k.set_defaults(run=_kv_transfer)

    sv = bsub.add_parser("serve", help="open-loop serving load generator against a running server (HTTP or gRPC)")
    from baton.perf.loadgen.cli import add_arguments as _serve_arguments  # argparse only: cheap

    _serve_arguments(sv)
    sv.set_defaults(run=_serve)

    s = bsub.add_parser("scheduler", help="scheduler + batch preparation time per step (fake runner)")
    s.add_argument("--num-seqs", type=int, default=256)
    s.add_argument("--steps", type=int, default=400)
    s.add_argument("--json", action="store_true")
    s.set_defaults(run=_scheduler)


def _offline(args: argparse.Namespace) -> int:
    from baton.perf.offline import WORKLOADS, format_table, run_offline, to_json

    if args.workload not in WORKLOADS:
        raise ValueError(f"unknown workload {args.workload!r}; choose one of {', '.join(WORKLOADS)}")
    if args.n is not None and args.n <= 0:
        raise ValueError(f"--n must be positive, got {args.n}")
    if args.repeat < 1:
        raise ValueError(f"--repeat must be at least 1, got {args.repeat}")
    if args.speculative_tokens < 0:
        raise ValueError(f"--speculative-tokens must be 0 (off) or positive, got {args.speculative_tokens}")
    result = run_offline(
        args.workload,
        args.model,
        args.n,
        include_hf=not args.skip_hf,
        threads=args.threads,
        max_num_batched_tokens=args.max_num_batched_tokens,
        repeat=args.repeat,
        torch_path_baseline=args.torch_path_baseline,
        speculative_tokens=args.speculative_tokens,
        greedy_head_baseline=args.greedy_head_baseline,
        amx_baseline=args.amx_baseline,
        tensor_parallel_size=args.tensor_parallel_size,
        progress=lambda m: print(f"[bench] {m}", file=sys.stderr, flush=True),
    )
    print(to_json(result) if args.json else format_table(result))
    return 0


def _scheduler(args: argparse.Namespace) -> int:
    from baton.perf.scheduler_overhead import check_args, main

    check_args(args.num_seqs, args.steps)  # before anything is allocated
    return main(["--num-seqs", str(args.num_seqs), "--steps", str(args.steps)] + (["--json"] if args.json else []))


def _interference(args: argparse.Namespace) -> int:
    import json

    from baton.perf.interference import run_from_args

    r = run_from_args(args)
    if args.json:
        print(json.dumps(r, indent=2))
    else:
        for name in r["setups"]:
            x = r[name]
            print(
                f"{name:14s} ITL p50 {x['itl_s']['p50'] * 1e3:7.1f} ms  p99 {x['itl_s']['p99'] * 1e3:7.1f} ms  "
                f"p99.9 {x['itl_s']['p999'] * 1e3:7.1f} ms   "
                f"{x['output_tok_s']:.1f} output tok/s, {x['total_tok_s']:.1f} total tok/s"
            )
    return 0


def _kv_transfer(args: argparse.Namespace) -> int:
    from baton.perf.kv_transfer_bench import check_args, main

    # Here, so that a bad flag is a `baton: error:` line (main's own parser would print its usage).
    check_args(args.lengths, args.repeats, args.chunk_tokens, args.device, args.geometry, args.dtype)
    return main(
        [
            "--lengths",
            args.lengths,
            "--repeats",
            str(args.repeats),
            "--chunk-tokens",
            str(args.chunk_tokens),
            "--device",
            args.device,
            "--geometry",
            args.geometry,
        ]
        + (["--dtype", args.dtype] if args.dtype else [])
        + (["--no-ray"] if args.no_ray else [])
        + (["--json"] if args.json else [])
    )


def _serve(args: argparse.Namespace) -> int:
    from baton.perf.loadgen.cli import run

    return run(args)
