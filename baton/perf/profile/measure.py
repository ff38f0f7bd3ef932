"""Time the real engine's ``step()`` over a grid of batch shapes (torch).

The engine is the one a worker runs (same model, dtype, threads, attention backend, output
processing). States are set up without computing them where the timing does not depend on the
KV values: a decode batch of B sequences at context L is B reservations whose "KV arrived" (the
decode worker's own path, ``reserve`` + ``kv_arrived``), and a prefill chunk over C tokens of
prefix context reuses a prefix registered the same way (a prefix-cache hit). Only the timed steps
compute anything.

Grid: decode (B sequences at context L), ragged decode (one long row among short ones: the CPU
kernel pads to the longest), prefill chunks of T tokens with and without prefix context, and
mixed steps (a decode batch plus a prefill chunk, as a colocated worker runs them).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from baton.perf.profile.cost_model import Sample
from baton.perf.profile.step_shape import shape_of_rows


@dataclass(frozen=True)
class Grid:
    decode: tuple[tuple[int, int], ...]  # (B, L)
    ragged: tuple[tuple[int, int, int], ...]  # (B, short L, long L): B - 1 short rows and one long
    prefill: tuple[tuple[int, int], ...]  # (T new tokens, C tokens of prefix context)
    mixed: tuple[tuple[int, int, int], ...]  # (B decodes at context L, T-token prefill chunk)
    repeats: int = 5  # the fastest repeat counts (noise on a shared machine only adds time)
    max_point_s: float = 3.0  # stop repeating a point after this much time (long prefills)

    def fit_to(self, max_model_len: int, steps: int) -> Grid:
        """Drop the points the model's context cannot hold."""
        ok = lambda n: n + steps + 2 <= max_model_len  # noqa: E731
        return Grid(
            tuple(p for p in self.decode if ok(p[1])),
            tuple(p for p in self.ragged if ok(p[2])),
            tuple(p for p in self.prefill if ok(p[0] + p[1])),
            tuple(p for p in self.mixed if ok(max(p[1], p[2]))),
            self.repeats,
            self.max_point_s,
        )


def default_grid(max_batch_context: int = 32768) -> Grid:
    # Small batches are where a CPU worker's inter-token latency is decided: sample them densely.
    decode = tuple(
        (b, n) for b in (1, 2, 3, 4, 6, 8, 16, 32, 64) for n in (64, 256, 1024, 2048) if b * n <= max_batch_context
    )
    return Grid(
        decode=decode,
        ragged=((8, 64, 2048), (16, 64, 1024), (32, 128, 512)),
        prefill=tuple((t, c) for t in (16, 64, 256, 512, 1024, 2048) for c in (0, 1024)),
        mixed=((4, 128, 256), (16, 128, 512), (8, 256, 1024), (32, 64, 128)),
    )


def quick_grid() -> Grid:
    return Grid(
        decode=tuple((b, n) for b in (1, 4, 16) for n in (64, 512)),
        ragged=((4, 64, 512),),
        prefill=((16, 0), (128, 0), (512, 0), (128, 256)),
        mixed=((4, 64, 128),),
        repeats=2,
        max_point_s=1.0,
    )


class StepTimer:
    """Owns an engine sized for the grid and times single steps of prepared batches."""

    def __init__(self, engine, grid: Grid, seed: int = 0) -> None:
        from engine.sampling_params import SamplingParams

        self.engine = engine
        self.grid = grid
        self.rng = random.Random(seed)
        self.vocab = engine.model_config.vocab_size
        # Outputs are detokenized like a served request's (the output processor is part of the step).
        self.params = SamplingParams(max_tokens=grid.repeats + 8, ignore_eos=True)
        self._n = 0
        self.block_size = engine.block_manager.block_size

    def _tokens(self, n: int) -> list[int]:
        return [self.rng.randrange(3, self.vocab) for _ in range(n)]

    def _rid(self) -> str:
        self._n += 1
        return f"profile-{self._n}"

    def _decoding(self, context: int, max_tokens: int | None = None) -> str:
        """A sequence in decode at ``context`` tokens, its KV "arrived" (never computed: timing only)."""
        rid = self._rid()
        params = self.params if max_tokens is None else replace(self.params, max_tokens=max_tokens)
        if self.engine.reserve(rid, self._tokens(context - 1), params) is None:
            raise RuntimeError(f"profile: no KV room for a {context}-token sequence (grid too big for the pool)")
        self.engine.kv_arrived(rid, self._tokens(1)[0])
        return rid

    def _timed_step(self, kind: str) -> Sample:
        sched = self.engine.scheduler
        known = {rid: r.num_tokens for rid, r in sched.requests.items()}
        t0 = time.perf_counter()
        self.engine.step()
        dt = time.perf_counter() - t0
        so = self.engine.last_scheduler_output
        ends = [sched.requests[rid].num_computed_tokens for rid in so.request_ids]
        shape = shape_of_rows(so.counts, ends, [known[rid] for rid in so.request_ids], self.block_size)
        return Sample(kind, shape, dt)

    def _clear(self) -> None:
        for rid in list(self.engine.scheduler.requests):
            self.engine.abort(rid)

    def decode(self, lengths: list[int], kind: str = "decode") -> list[Sample]:
        rids = [self._decoding(n) for n in lengths]
        self.engine.step()  # untimed: a new batch's first step builds its rows
        out, spent = [], 0.0
        for _ in range(self.grid.repeats):
            s = self._timed_step(kind)
            out.append(s)
            spent += s.seconds
            if spent > self.grid.max_point_s:
                break
        del rids
        self._clear()
        return out

    def prefill(self, chunk: int, context: int, decodes: tuple[int, int] = (0, 0)) -> list[Sample]:
        out, spent = [], 0.0
        for _ in range(self.grid.repeats):
            prefix = self._tokens(context)
            if context:  # register the prefix in the cache, then let it go: the next prompt hits it
                rid = self._rid()
                self.engine.reserve(rid, prefix + self._tokens(1), self.params)
                self.engine.kv_arrived(rid, 5)
                self.engine.abort(rid)
            b, ln = decodes
            for _ in range(b):
                self._decoding(ln)
            if b:
                self.engine.step()  # untimed: the decode rows join the batch
            self.engine.add_request(self._rid(), prefix + self._tokens(chunk), self.params)
            s = self._timed_step("mixed" if b else "prefill")
            out.append(s)
            spent += s.seconds
            self._clear()
            if spent > self.grid.max_point_s:
                break
        return out

    def run(self, progress: Callable[[str], None]) -> list[Sample]:
        g = self.grid
        samples: list[Sample] = []
        self.prefill(16, 0)  # warm the kernels and the allocator
        self.decode([64, 64])

        def add(label: str, got: list[Sample]) -> None:
            point = len({s.point for s in samples})
            samples.extend(replace(s, point=point) for s in got)
            progress(f"{label}: {min(s.seconds for s in got) * 1e3:.1f} ms")

        for b, n in g.decode:
            add(f"decode B={b} L={n}", self.decode([n] * b))
        for b, short, long in g.ragged:
            add(f"ragged decode B={b} L={short}..{long}", self.decode([short] * (b - 1) + [long]))
        for t, c in g.prefill:
            add(f"prefill T={t} C={c}", self.prefill(t, c))
        for b, n, t in g.mixed:
            add(f"mixed B={b} L={n} + T={t}", self.prefill(t, 0, decodes=(b, n)))
        return samples


def fastest_per_point(samples: list[Sample]) -> list[Sample]:
    """One sample per grid point, its fastest repeat: on a shared machine noise only ever adds time."""
    best: dict[int, Sample] = {}
    for s in samples:
        if s.point not in best or s.seconds < best[s.point].seconds:
            best[s.point] = s
    return [best[p] for p in sorted(best)]


def typical_over_fastest(samples: list[Sample]) -> float:
    """How much slower a typical step is than the fastest repeat of the same batch: the mean over
    grid points (with repeats) of mean / fastest. The fit uses the fastest repeats (a clean model),
    but a serving worker lives with the noise; the simulator multiplies its steps by this."""
    by_point: dict[int, list[float]] = {}
    for s in samples:
        by_point.setdefault(s.point, []).append(s.seconds)
    ratios = [sum(v) / len(v) / min(v) for v in by_point.values() if len(v) >= 2 and min(v) > 0]
    return sum(ratios) / len(ratios) if ratios else 1.0


def engine_for_grid(
    model: str,
    grid: Grid,
    threads: int | None,
    device: str = "auto",
    dtype: str = "auto",
    block_size: int = 16,
    progress: Callable[[str], None] | None = None,
):
    """An engine with room for every grid point (and no more: the KV pool is sized from the grid)."""
    from engine.config import CacheConfig, EngineConfig, SchedulerConfig
    from engine.engine import LLMEngine

    steps = grid.repeats + 8
    need_tokens = max(
        [b * (n + steps) for b, n in grid.decode]
        + [(b - 1) * (s + steps) + long + steps for b, s, long in grid.ragged]
        + [2 * (c + t + steps) for t, c in grid.prefill]
        + [b * (n + steps) + t + steps for b, n, t in grid.mixed]
        + [256]
    )
    max_b = max([b for b, _ in grid.decode] + [b for b, _, _ in grid.ragged] + [b for b, _, _ in grid.mixed] + [2])
    max_t = max([t for t, _ in grid.prefill] + [t for _, _, t in grid.mixed] + [16])
    num_blocks = -(-need_tokens // block_size) + 2 * max_b + 64
    cfg = EngineConfig(
        model=model,
        device=device,
        dtype=dtype,
        num_threads=threads,
        scheduler=SchedulerConfig(max_num_seqs=max_b + 4, max_num_batched_tokens=max_t + max_b + 16),
        cache=CacheConfig(block_size=block_size, num_blocks=num_blocks),
    )
    return LLMEngine(cfg, progress=progress)
