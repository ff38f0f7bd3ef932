"""``baton`` command line: parses arguments, dispatches to ``baton.commands.*``, and turns bad input
into a one-line message naming the problem (exit code 2) instead of a traceback."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from baton.commands import bench, chat, cluster_cmd, config_cmd, generate, plan, profile, up

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="baton", description="Baton: disaggregated prefill/decode LLM serving")
    # Any case; argparse converts a string default with ``type`` but does not check it against the
    # choices, so main() checks what BATON_LOG_LEVEL gave.
    parser.add_argument(
        "--log-level",
        type=str.upper,
        choices=LOG_LEVELS,
        default=os.environ.get("BATON_LOG_LEVEL") or "WARNING",
        help="also BATON_LOG_LEVEL (default WARNING)",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in (up, cluster_cmd, generate, chat, bench, config_cmd, profile, plan):
        module.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.log_level not in LOG_LEVELS:  # only the environment variable gets past the choices
        print(
            f"baton: error: BATON_LOG_LEVEL must be one of {', '.join(LOG_LEVELS)} (any case), "
            f"got {os.environ.get('BATON_LOG_LEVEL')!r}",
            file=sys.stderr,
        )
        return 2
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from engine.errors import InvalidParameterError, ModelLoadError

    try:
        return args.run(args)
    except KeyboardInterrupt:
        print("baton: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`baton generate ... | head`): nothing is wrong with the command, so no
        # message. Point stdout at devnull so the interpreter's final flush does not fail again, and
        # exit 141 (128 + SIGPIPE), what a shell tool killed by SIGPIPE reports, so a pipeline with
        # pipefail still sees that the output was cut short.
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):  # stdout is not a file (a test's StringIO)
            pass
        return 141
    except MemoryError as e:  # a buffer sized from the flags (numpy's message gives the size, not the flag)
        print(
            f"baton: error: out of memory ({e}); lower max_num_seqs, max_model_len or the KV cache size",
            file=sys.stderr,
        )
        return 2
    except Exception as e:  # only the ones that say what the user got wrong; others raise
        message = user_error(e, (InvalidParameterError, ModelLoadError, ValueError, RuntimeError, OSError))
        if message is None:
            raise
        _stop_ray_log_stream()
        print(f"baton: error: {message}", file=sys.stderr)
    return 2


def _stop_ray_log_stream() -> None:
    """A worker that failed to start streams its traceback and Ray's crash dump to this terminal
    after the fact: stop the stream, so the one line saying what went wrong is the last one."""
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        try:
            ray.shutdown()
        except Exception:  # noqa: BLE001 - best effort: the error message matters, not the shutdown
            pass


def user_error(error: BaseException, kinds: tuple[type[BaseException], ...]) -> str | None:
    """The one-line message of a bad-input error, found through the wrappers a Ray worker's error
    arrives in (a bad model path fails inside the workers ``baton up`` starts); None for a bug."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, kinds) and not _is_ray_wrapper(current):
            param = getattr(current, "param", None)
            return f"{param}: {current.message}" if param and hasattr(current, "message") else str(current).strip()
        current = getattr(current, "cause", None) or current.__cause__
    return None


def _is_ray_wrapper(error: BaseException) -> bool:
    return type(error).__module__.startswith("ray.")


if __name__ == "__main__":
    raise SystemExit(main())
