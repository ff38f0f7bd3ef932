"""Offline benchmark workloads.

A workload is a list of requests, each a tokenized prompt plus the exact number of tokens to generate. EOS is
ignored by every system under test, so every request produces exactly ``max_tokens`` tokens and the useful work is
identical across systems: throughput numbers are then directly comparable.

This module is deliberately torch-free (and numpy-free): the workload must be bit-identical in every process and on
every platform, so it is drawn only with ``random.Random(seed)``, whose integer and float draws are specified by the
Python language rather than by a library version.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class OfflineRequest:
    """One offline request: the prompt token ids and the exact number of tokens to generate (EOS ignored)."""

    prompt_token_ids: tuple[int, ...]
    max_tokens: int

    def __post_init__(self) -> None:
        if not self.prompt_token_ids:
            raise ValueError("an offline request needs a non-empty prompt")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")


def anyscale_cpu(
    vocab_size: int,
    n: int = 64,
    seed: int = 0,
    avoid_ids: frozenset[int] = frozenset(),
    prompt_len: tuple[int, int] = (64, 256),
    mean_output: float = 64.0,
    output_clip: tuple[int, int] = (4, 256),
) -> list[OfflineRequest]:
    """The ``anyscale-cpu`` offline workload: a CPU-sized take on Anyscale's continuous-batching benchmark.

    Prompt lengths are uniform integers in ``prompt_len`` (inclusive), prompt tokens are uniform over the vocabulary
    minus ``avoid_ids`` (BOS/EOS and other special tokens, so a prompt never contains them), and output lengths are
    exponential with mean ``mean_output``, rounded and clipped to ``output_clip`` (inclusive). The exponential tail is
    what makes static batching waste compute: a static batch runs until its longest request ends.

    Each request's draws are consumed in order (prompt length, prompt tokens, output length), so the workload for
    ``n`` is a prefix of the workload for any larger ``n`` with the same other arguments.
    """
    lo_p, hi_p = prompt_len
    lo_o, hi_o = output_clip
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if not 1 <= lo_p <= hi_p:
        raise ValueError(f"prompt_len must satisfy 1 <= lo <= hi, got {prompt_len}")
    if not 1 <= lo_o <= hi_o:
        raise ValueError(f"output_clip must satisfy 1 <= lo <= hi, got {output_clip}")
    if mean_output <= 0:
        raise ValueError(f"mean_output must be > 0, got {mean_output}")

    # Built in id order (never from set iteration order) so the index -> id mapping is the same everywhere.
    allowed = [i for i in range(vocab_size) if i not in avoid_ids]
    if not allowed:
        raise ValueError(f"no token id left in a vocabulary of {vocab_size} after removing {len(avoid_ids)} ids")

    rng = random.Random(seed)
    requests: list[OfflineRequest] = []
    for _ in range(n):
        length = rng.randint(lo_p, hi_p)
        prompt = tuple(allowed[rng.randrange(len(allowed))] for _ in range(length))
        out = rng.expovariate(1.0 / mean_output)
        max_tokens = min(max(round(out), lo_o), hi_o)
        requests.append(OfflineRequest(prompt_token_ids=prompt, max_tokens=max_tokens))
    return requests


def total_output_tokens(requests: Iterable[OfflineRequest]) -> int:
    """Useful output tokens of a workload: the sum of every request's own ``max_tokens``."""
    return sum(r.max_tokens for r in requests)


def total_prompt_tokens(requests: Iterable[OfflineRequest]) -> int:
    """Prompt tokens of a workload (what every system must prefill at least once)."""
    return sum(len(r.prompt_token_ids) for r in requests)


def expected_mean_output(mean_output: float = 64.0, output_clip: tuple[int, int] = (4, 256)) -> float:
    """Expected ``max_tokens`` of one request, ignoring the rounding (a half-token effect at most).

    For X ~ Exp(mean m) clipped to [a, b]: E = a + m * (exp(-a/m) - exp(-b/m)). Used by the tests as the reference
    for a statistical sanity check, and handy for sizing a benchmark before running it.
    """
    a, b = output_clip
    m = mean_output
    return a + m * (math.exp(-a / m) - math.exp(-b / m))


def describe(requests: Sequence[OfflineRequest]) -> dict[str, float | int]:
    """Summary statistics of a workload, for logs and JSON reports."""
    n = len(requests)
    outs = [r.max_tokens for r in requests]
    prompts = [len(r.prompt_token_ids) for r in requests]
    return {
        "requests": n,
        "prompt_tokens": sum(prompts),
        "output_tokens": sum(outs),
        "mean_prompt_len": sum(prompts) / n if n else 0.0,
        "mean_output_len": sum(outs) / n if n else 0.0,
        "max_output_len": max(outs, default=0),
    }
