"""Delta messages from the scheduler to the model runner, and the runner's reply (pure Python).

The runner keeps a persistent batch (token ids and block tables per request); each step the
scheduler tells it only what changed: new (or resumed) requests in full, continuing requests by
their newly allocated block ids, and which requests left the batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.sampling_params import SamplingParams


@dataclass(slots=True)
class NewRequestData:
    request_id: str
    token_ids: list[int]  # every known token: the prompt, plus generated ones when resuming
    block_ids: list[int]
    num_computed_tokens: int
    num_prompt_tokens: int
    sampling_params: SamplingParams


@dataclass(slots=True)
class CachedRequestData:
    request_ids: list[str] = field(default_factory=list)
    new_block_ids: list[list[int] | None] = field(default_factory=list)


@dataclass(slots=True)
class SchedulerOutput:
    new_requests: list[NewRequestData]
    cached_requests: CachedRequestData
    # request id -> tokens to compute this step, in batch order.
    num_scheduled_tokens: dict[str, int]
    total_num_scheduled_tokens: int
    # Rows the runner drops before this step: finished, aborted or preempted since the last step.
    finished_request_ids: set[str]
    num_preempted: int = 0

    @property
    def is_empty(self) -> bool:
        return self.total_num_scheduled_tokens == 0


@dataclass(slots=True)
class RunnerOutput:
    """One sampled token per request that reached the end of its known tokens this step."""

    request_ids: list[str]
    sampled_token_ids: list[int]
