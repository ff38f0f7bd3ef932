"""``baton`` command line: parses arguments, dispatches to ``baton.commands.*``, and turns bad input
into a one-line message naming the problem (exit code 2) instead of a traceback."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from baton.commands import bench, chat, cluster_cmd, config_cmd, generate, plan, profile, up


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="baton", description="Baton: disaggregated prefill/decode LLM serving")
    parser.add_argument("--log-level", default=os.environ.get("BATON_LOG_LEVEL", "WARNING"),
                        choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in (up, cluster_cmd, generate, chat, bench, config_cmd, profile, plan):
        module.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from engine.errors import InvalidParameterError, ModelLoadError

    try:
        return args.run(args)
    except InvalidParameterError as e:
        print(f"baton: error: {e.param}: {e.message}", file=sys.stderr)
    except (ModelLoadError, ValueError, RuntimeError) as e:
        print(f"baton: error: {e}", file=sys.stderr)
    except KeyboardInterrupt:
        print("baton: interrupted", file=sys.stderr)
        return 130
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
