"""``baton cluster --config FILE``: run Baton on an existing Ray cluster (``RAY_ADDRESS``), placing
actors by the custom resources ``baton_router`` / ``baton_prefill`` / ``baton_decode``, supervising
them until SIGTERM, then draining. This is the entrypoint of ``ray job submit`` and of the Helm
chart's RayJob."""

from __future__ import annotations

import argparse
import sys


def add_parser(sub) -> None:
    p = sub.add_parser("cluster", help="run on an existing Ray cluster (ray job submit ... -- python -m baton cluster)")
    p.add_argument("--config", help="a YAML config (see `baton config --print-defaults`)")
    p.add_argument("--ray-address", help="default: $RAY_ADDRESS, else 'auto'")
    p.add_argument("--model", help="default | tiny | a model path (overrides model.path)")
    p.add_argument("--http-port", type=int)
    p.add_argument("--grpc-port", type=int)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from baton.config import load_config
    from baton.supervisor import run_cluster

    cfg = load_config(
        args.config,
        {
            "cluster.ray_address": args.ray_address,
            "model.path": args.model,
            "router.http_port": args.http_port,
            "router.grpc_port": args.grpc_port,
        },
    )

    def say(msg: str) -> None:
        print(f"[baton cluster] {msg}", file=sys.stderr, flush=True)

    return run_cluster(cfg, say)
