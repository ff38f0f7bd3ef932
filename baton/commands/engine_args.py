"""Engine flags shared by the commands that build an engine."""

from __future__ import annotations

import argparse

from engine.config import CacheConfig, EngineConfig, SchedulerConfig, SpeculativeConfig


def add_engine_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("engine")
    g.add_argument("--model", default="default", help="default (SmolLM2-135M-Instruct), tiny, or a HF dir / .gguf path")
    g.add_argument("--device", default="auto", help="auto, cpu or cuda[:N]")
    g.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    g.add_argument("--max-model-len", type=int, default=None)
    g.add_argument("--max-num-seqs", type=int, default=256)
    g.add_argument("--max-num-batched-tokens", type=int, default=2048)
    g.add_argument("--block-size", type=int, default=16)
    g.add_argument("--num-kv-blocks", type=int, default=None)
    g.add_argument("--kv-cache-gb", type=float, default=None)
    g.add_argument("--no-prefix-caching", action="store_true")
    g.add_argument("--attention-backend", default="auto", choices=["auto", "torch", "triton"])
    g.add_argument("--threads", type=int, default=None, help="torch CPU threads (per rank with --tensor-parallel-size)")
    g.add_argument(
        "--tensor-parallel-size",
        type=int,
        default=1,
        metavar="N",
        help="shard the model over N ranks (local processes; one GPU each on CUDA, one thread each "
        "on CPU unless --threads); N must divide the model's attention heads",
    )
    g.add_argument("--no-cuda-graphs", action="store_true", help="CUDA: run every decode step eagerly")
    g.add_argument(
        "--speculative-tokens",
        type=int,
        default=0,
        metavar="K",
        help="n-gram speculative decoding: up to K drafted tokens a step for each decoding request (0: off)",
    )


def engine_config_from_args(args: argparse.Namespace, **overrides) -> EngineConfig:
    spec = SpeculativeConfig.from_num_tokens(getattr(args, "speculative_tokens", 0), "--speculative-tokens")
    sched = SchedulerConfig(
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        speculative=spec,
        **overrides.pop("scheduler", {}),
    )
    cache = CacheConfig(
        block_size=args.block_size,
        num_blocks=args.num_kv_blocks,
        kv_cache_memory_gb=args.kv_cache_gb,
        enable_prefix_caching=not args.no_prefix_caching,
    )
    return EngineConfig(
        model=args.model,
        device=args.device,
        dtype=args.dtype,
        max_model_len=args.max_model_len,
        attention_backend=args.attention_backend,
        num_threads=args.threads,
        cuda_graphs=not args.no_cuda_graphs,
        scheduler=sched,
        tensor_parallel_size=getattr(args, "tensor_parallel_size", 1),
        cache=cache,
        **overrides,
    )


def progress_printer(quiet: bool):
    import sys

    def say(msg: str) -> None:
        if not quiet:
            print(f"[baton] {msg}", file=sys.stderr, flush=True)

    return say
