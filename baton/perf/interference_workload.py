"""The interference bench's workload and arguments (baton/perf/interference.py runs it). Light: the CLI
builds its parser from here without importing Ray or torch."""

from __future__ import annotations

import argparse
from dataclasses import dataclass


@dataclass(frozen=True)
class InterferenceWorkload:
    # 64 streams: a decode batch sized for a ~100 ms ITL on the 2-core reference host. Each long
    # prompt stalls each colocated stream once, so the stalls are 1 / (long_every_s x decode steps a
    # second) of the gaps; with 8 or 32 streams and 13-36 ms steps that is 0.2-0.6%, which p99 does
    # not see (docs/BENCHMARKS.md, the interference sweep).
    interactive: int = 64
    interactive_prompt: tuple[int, int] = (32, 64)
    interactive_max_tokens: tuple[int, int] = (64, 192)  # uniform; (128, 128): every stream in lockstep
    long_len: int = 2048
    long_max_tokens: int = 8
    long_every_s: float = 6.0
    duration_s: float = 40.0
    warmup_s: float = 5.0
    seed: int = 0


MAX_SECONDS = 86400.0  # a day: --duration and --long-every
MAX_INTERACTIVE = 4096  # interactive streams: one client thread each


def add_arguments(ap: argparse.ArgumentParser) -> None:
    w = InterferenceWorkload()
    lo, hi = w.interactive_max_tokens
    ap.add_argument("--model", default="default")
    ap.add_argument("--duration", type=float, default=w.duration_s, help="measured seconds per setup")
    ap.add_argument("--interactive", type=int, default=w.interactive, help="concurrent interactive streams")
    ap.add_argument(
        "--interactive-max-tokens",
        default=f"{lo}-{hi}",
        help="output tokens of an interactive request: N, or LO-HI drawn uniformly",
    )
    ap.add_argument("--long-len", type=int, default=w.long_len, help="tokens per long prompt")
    ap.add_argument("--long-every", type=float, default=w.long_every_s, help="seconds between long prompts")
    ap.add_argument("--max-num-batched-tokens", type=int, default=2048)
    ap.add_argument(
        "--local-prefill-threshold",
        type=int,
        default=256,
        help="disaggregated setup: shorter prompts prefill on the decode worker (>= 0)",
    )
    ap.add_argument(
        "--short-prompts-to-idle-prefill",
        choices=("on", "off"),
        default="on",
        help="disaggregated setup: short prompts go to the prefill worker while it has room "
        "(pools.short_prompts_to_idle_prefill)",
    )
    ap.add_argument(
        "--decode-prefill-budget",
        type=int,
        default=256,
        help="disaggregated setup: prompt tokens a decode step may add (0: its whole budget)",
    )
    ap.add_argument(
        "--small-chunk-baseline", type=int, default=0, help="also run colocated with this prefill chunk size (0: skip)"
    )
    ap.add_argument(
        "--kv-shared-memory",
        action="store_true",
        help="KV caches in /dev/shm: the disaggregated transfer copies from the peer's cache",
    )
    ap.add_argument("--json", action="store_true")


def workload_from_args(a: argparse.Namespace) -> InterferenceWorkload:
    """The workload the arguments name; ValueError naming the argument that is not valid. Every
    flag is checked here, before a cluster starts."""
    # Finite: inf overflows time.sleep / Event.wait (in a thread, for --long-every: the run then
    # ended "fine" with no long prompt sent), and NaN compares false with everything.
    for flag, v in (("--duration", a.duration), ("--long-every", a.long_every)):
        if not 0 < v <= MAX_SECONDS:
            raise ValueError(f"{flag} must be a number of seconds in (0, {MAX_SECONDS:g}], got {v}")
    for flag, v, lo, hi in (
        ("--interactive", a.interactive, 1, MAX_INTERACTIVE),  # a thread each
        ("--long-len", a.long_len, 1, None),
        ("--max-num-batched-tokens", a.max_num_batched_tokens, 1, None),
        ("--local-prefill-threshold", a.local_prefill_threshold, 0, None),
        ("--decode-prefill-budget", a.decode_prefill_budget, 0, None),
        ("--small-chunk-baseline", a.small_chunk_baseline, 0, None),
    ):
        if v < lo or (hi is not None and v > hi):
            raise ValueError(f"{flag} must be {f'between {lo} and {hi}' if hi else f'>= {lo}'}, got {v}")
    low, _, high = str(a.interactive_max_tokens).partition("-")
    try:
        span = (int(low), int(high or low))
    except ValueError:
        raise ValueError(f"--interactive-max-tokens must be N or LO-HI, got {a.interactive_max_tokens!r}") from None
    if not 1 <= span[0] <= span[1]:
        raise ValueError(
            f"--interactive-max-tokens must be N or LO-HI with 1 <= LO <= HI, got {a.interactive_max_tokens!r}"
        )
    return InterferenceWorkload(
        interactive=a.interactive,
        interactive_max_tokens=span,
        long_len=a.long_len,
        long_every_s=a.long_every,
        duration_s=a.duration,
    )
