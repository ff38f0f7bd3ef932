"""``baton up``: the whole serving stack on this machine (Ray local, embedded Redis, both pools,
the router with HTTP and gRPC)."""

from __future__ import annotations

import argparse
import sys


def add_parser(sub) -> None:
    p = sub.add_parser("up", help="serve the model on this machine (OpenAI HTTP + gRPC)")
    p.add_argument("--config", help="a YAML config (see `baton config --print-defaults`)")
    p.add_argument("--model", help="default | tiny | a model path")
    p.add_argument("--prefill-workers", type=int)
    p.add_argument("--decode-workers", type=int)
    p.add_argument("--host")
    p.add_argument("--http-port", type=int)
    p.add_argument("--grpc-port", type=int)
    p.add_argument("--redis-url", help="an existing Redis (default: start an embedded redis-server)")
    p.add_argument("--tensor-parallel-size", type=int, metavar="N", help="ranks every worker spans (engine)")
    p.add_argument("--prefill-tensor-parallel-size", type=int, metavar="N", help="ranks a prefill worker spans")
    p.add_argument("--decode-tensor-parallel-size", type=int, metavar="N", help="ranks a decode worker spans")
    p.add_argument("--api-key-env", metavar="VAR", help="require this environment variable's value as the API key")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from baton.config import load_config
    from baton.serve import serve_forever

    overrides = {
        "model.path": args.model,
        "pools.prefill.workers": args.prefill_workers,
        "pools.decode.workers": args.decode_workers,
        "router.host": args.host,
        "router.http_port": args.http_port,
        "router.grpc_port": args.grpc_port,
        "redis.url": args.redis_url,
        "auth.api_key": {"env": args.api_key_env} if args.api_key_env else None,
        "engine.tensor_parallel_size": args.tensor_parallel_size,
        "pools.prefill.tensor_parallel_size": args.prefill_tensor_parallel_size,
        "pools.decode.tensor_parallel_size": args.decode_tensor_parallel_size,
    }
    cfg = load_config(args.config, overrides)

    def say(msg: str) -> None:
        print(f"[baton] {msg}", file=sys.stderr, flush=True)

    return serve_forever(cfg, say)
