"""What to run, as the router hands it to a worker (pure Python, picklable, no engine state)."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.sampling_params import SamplingParams


@dataclass(frozen=True)
class RequestSpec:
    request_id: str
    prompt_token_ids: tuple[int, ...]
    sampling_params: SamplingParams
    priority: int = 0
    cache_salt: str | None = None
    preemptible: bool = True  # its lane's: False is preempted only when no preemptible request runs
    # Tokens already generated for this request elsewhere (migration after a worker died).
    resume_token_ids: tuple[int, ...] = field(default=())
    # How much of those tokens' text the caller has received: a worker holds back the text of a token
    # that ends inside a UTF-8 sequence (or may begin a stop string); the new worker sends the rest.
    resume_text_chars: int = 0
    origin: str = ""  # the router replica that owns the request (its outputs go back there)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)
