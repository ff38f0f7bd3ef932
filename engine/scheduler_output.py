"""Delta messages from the scheduler to the model runner, and the runner's reply (pure Python).

The runner keeps a persistent batch (token ids and block tables per request); each step the
scheduler tells it only what changed: new (or resumed) requests in full, and the continuing
requests that got new blocks. Every running request owns a *slot* (a runner row) from joining the
batch until it leaves, so a decode that needs no new block costs the runner one integer.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.logprobs import TokenLogprob
from engine.output_error import OutputError
from engine.sampling_params import SamplingParams


@dataclass(slots=True)
class NewRequestData:
    request_id: str
    slot: int  # the runner row this request occupies while it is running
    token_ids: list[int]  # every known token: the prompt, plus generated ones when resuming
    block_ids: list[int]
    num_computed_tokens: int
    num_prompt_tokens: int
    sampling_params: SamplingParams
    long_rope: bool = False  # rotated with longrope's long factors (Request.long_rope)


@dataclass(slots=True)
class SchedulerOutput:
    new_requests: list[NewRequestData]
    # Continuing requests that got blocks this step: slot -> the new block ids.
    new_block_ids: dict[int, list[int]]
    # The batch, in order (decodes first): request ids, their slots, tokens to compute.
    request_ids: list[str]
    slots: list[int]
    counts: list[int]
    total_num_scheduled_tokens: int
    # Requests that left the batch since the last step (finished, aborted, preempted, handed off).
    finished_request_ids: set[str]
    num_preempted: int = 0
    # Speculative decoding: slot -> the tokens drafted to follow its known tokens, which this step
    # computes after the row's last token (its count is 1 + len(drafts)).
    spec_token_ids: dict[int, list[int]] = field(default_factory=dict)

    @property
    def is_empty(self) -> bool:
        return self.total_num_scheduled_tokens == 0

    @property
    def num_scheduled_tokens(self) -> dict[str, int]:
        return dict(zip(self.request_ids, self.counts))


@dataclass(slots=True)
class RunnerOutput:
    """One sampled token per request that reached the end of its known tokens this step (and the
    logprobs asked for)."""

    slots: list[int]
    sampled_token_ids: list[int]
    # Per row, for requests that asked for logprobs (None for the others); None if none asked.
    logprobs: list[TokenLogprob | None] | None = None
    # slot -> (index of the first prompt token covered, its logprobs and the next ones'), for the
    # prompt chunks of requests that asked for prompt logprobs.
    prompt_logprobs: dict[int, tuple[int, list[TokenLogprob]]] | None = None
    # Speculative decoding: slot -> the drafts the model agreed with (in order), which come before
    # that slot's sampled token; None when no row had drafts.
    accepted_draft_ids: dict[int, list[int]] | None = None
    # ... and slot -> the logprobs of the tokens a row with drafts took (its kept drafts', then its
    # sampled token's), for requests that asked for logprobs; None when no such row had drafts.
    verified_logprobs: dict[int, list[TokenLogprob]] | None = None
    # slot -> why its request ends now with finish reason ERROR, its token dropped (its grammar's
    # matcher failed); None when none did.
    errors: dict[int, OutputError] | None = None
