"""Prompt token ids of an exact length for planned requests.

Prompts are sent as token ids (``/v1/completions`` and gRPC ``token_ids`` accept them), so a
request's prompt length is exactly ``PlannedRequest.prompt_len`` with no tokenizer on the client.

Every run draws its ids under a fresh ``salt``: two runs with the same seed send the same lengths
at the same times but different tokens, so a later run (a ``--search`` step, the next rate of an
experiment) never hits the prefix cache the previous one warmed. Within a run, the requests of one
prefix group share exactly their group's first ``prefix_len`` ids, and nothing else is shared.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from baton.perf.loadgen.arrivals import PlannedRequest
from baton.perf.loadgen.workload import WorkloadSpec

# Ids below 256 hold the special tokens of every model we serve (SmolLM2: 0-16, tiny: 0-2), and
# 4096 is the smallest vocabulary (the tiny model's): this range is valid for all of them.
DEFAULT_TOKEN_RANGE = (256, 4096)


@dataclass(frozen=True)
class PromptFactory:
    spec: WorkloadSpec
    salt: int
    token_low: int = DEFAULT_TOKEN_RANGE[0]
    token_high: int = DEFAULT_TOKEN_RANGE[1]  # exclusive

    def __post_init__(self) -> None:
        if not 0 <= self.token_low < self.token_high:
            raise ValueError(f"token range must satisfy 0 <= low < high, got [{self.token_low}, {self.token_high})")

    def _ids(self, key: str, n: int) -> list[int]:
        rng = random.Random(f"{key}:{self.salt}")
        return [rng.randrange(self.token_low, self.token_high) for _ in range(n)]

    def prefix(self, group: int) -> list[int]:
        return self._ids(f"prefix:{group}", self.spec.prefix_len)

    def token_ids(self, req: PlannedRequest, prompt_len: int | None = None) -> list[int]:
        """The prompt of ``req``; ``prompt_len`` overrides its length (clipped to a context window)."""
        n = req.prompt_len if prompt_len is None else prompt_len
        head = self.prefix(req.prefix_group)[:n] if req.prefix_group is not None else []
        return head + self._ids(f"req:{req.index}", n - len(head))


def clip_prompt_len(req: PlannedRequest, max_model_len: int | None) -> int:
    """The prompt length that leaves room for ``output_len`` in the model's context (at least 1)."""
    if max_model_len is None:
        return req.prompt_len
    return max(1, min(req.prompt_len, max_model_len - req.output_len))
