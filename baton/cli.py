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
    except KeyboardInterrupt:
        print("baton: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - only the ones that say what the user got wrong; others raise
        message = user_error(e, (InvalidParameterError, ModelLoadError, ValueError, RuntimeError, OSError))
        if message is None:
            raise
        print(f"baton: error: {message}", file=sys.stderr)
    return 2


def user_error(error: BaseException, kinds: tuple[type[BaseException], ...]) -> str | None:
    """The one-line message of a bad-input error, found through the wrappers a Ray worker's error
    arrives in (a bad model path fails inside the workers ``baton up`` starts); None for a bug."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, kinds) and not _is_ray_wrapper(error):
            param = getattr(error, "param", None)
            return f"{param}: {error.message}" if param and hasattr(error, "message") else str(error).strip()
        error = getattr(error, "cause", None) or error.__cause__
    return None


def _is_ray_wrapper(error: BaseException) -> bool:
    return type(error).__module__.startswith("ray.")


if __name__ == "__main__":
    raise SystemExit(main())
