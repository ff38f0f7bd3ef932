"""``baton config``: print the complete, commented default configuration, or validate a file."""

from __future__ import annotations

import argparse
from importlib import resources


def add_parser(sub) -> None:
    p = sub.add_parser("config", help="print the default config or validate a config file")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--print-defaults", action="store_true", help="print the complete, commented defaults")
    g.add_argument("--check", metavar="FILE", help="validate FILE and print the effective config")
    p.set_defaults(run=run)


def default_config_text() -> str:
    return resources.files("baton").joinpath("default_config.yaml").read_text()


def run(args: argparse.Namespace) -> int:
    if args.print_defaults:
        print(default_config_text(), end="")
        return 0
    import yaml

    from baton.config import load_config

    cfg = load_config(args.check)
    # Resolve every secret reference, as `baton up` will: a missing env var or file fails here, naming the field.
    cfg.lane_policy()
    cfg.redis_password()
    print(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False), end="")
    return 0
