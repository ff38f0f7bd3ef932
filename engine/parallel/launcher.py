"""How an engine's ranks 1..N-1 start: the narrow interface ``LLMEngine`` uses, and the starter
its caller chooses (local processes by default; a pool worker's Ray actors, injected)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from engine.config import EngineConfig
from engine.parallel.group import RankGroup
from engine.parallel.local_ranks import LocalRanks, RankPlan


class Ranks(Protocol):
    group: RankGroup

    def start_steps(self, eos_token_ids: tuple[int, ...]) -> None: ...

    def broadcast_plan(self, plan: RankPlan) -> None: ...

    def alive(self) -> bool: ...

    def close(self) -> None: ...


# How a caller starts ranks 1..N-1 (``LocalRanks``: local processes; a pool worker passes
# ``baton/ray_ranks.py``'s ``RayRanks``, Ray actors in its placement group: the engine imports no Ray).
RankStarter = Callable[[EngineConfig], "Ranks"]


def start_ranks(config: EngineConfig, starter: RankStarter | None = None) -> Ranks | None:
    """The other ranks of a tensor-parallel engine, starting to load their shards (None at TP 1)."""
    if config.tensor_parallel_size == 1:
        return None
    return (starter or LocalRanks)(config)
