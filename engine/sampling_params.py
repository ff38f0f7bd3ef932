"""Per-request sampling parameters, validated where they are built (torch-free)."""

from __future__ import annotations

from dataclasses import dataclass

from engine.errors import InvalidParameterError
from engine.logprobs import MAX_TOP_LOGPROBS

_MAX_STOP_STRINGS = 16


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How to turn logits into tokens for one request.

    ``temperature == 0`` is greedy. ``top_k == 0`` and ``top_p == 1`` disable those filters.
    ``seed`` makes a sampled request reproducible regardless of what it is batched with.
    ``logprobs``: None reports none; n >= 0 reports each generated token's logprob and the n most
    likely tokens at its position (engine/logprobs.py). ``prompt_logprobs``: the same for every
    prompt token after the first (the prompt is then computed whole: no prefix-cache hits).
    """

    max_tokens: int = 16
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    min_tokens: int = 0
    include_stop_str_in_output: bool = False
    detokenize: bool = True
    skip_special_tokens: bool = True
    logprobs: int | None = None
    prompt_logprobs: int | None = None

    def __post_init__(self) -> None:
        # Normalize list inputs (JSON gives lists) into tuples so params stay hashable/immutable.
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        elif not isinstance(self.stop, tuple):
            object.__setattr__(self, "stop", tuple(self.stop or ()))
        if not isinstance(self.stop_token_ids, tuple):
            object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids or ()))
        self._validate()

    def _validate(self) -> None:
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int) or self.max_tokens <= 0:
            raise InvalidParameterError("max_tokens", f"max_tokens must be a positive integer, got {self.max_tokens!r}")
        if not _is_number(self.temperature) or self.temperature < 0:
            raise InvalidParameterError("temperature", f"temperature must be >= 0, got {self.temperature!r}")
        if not _is_number(self.top_p) or not 0 < self.top_p <= 1:
            raise InvalidParameterError("top_p", f"top_p must be in (0, 1], got {self.top_p!r}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise InvalidParameterError("top_k", f"top_k must be an integer >= 0 (0 disables it), got {self.top_k!r}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise InvalidParameterError("seed", f"seed must be an integer, got {self.seed!r}")
        if isinstance(self.min_tokens, bool) or not isinstance(self.min_tokens, int) or self.min_tokens < 0:
            raise InvalidParameterError("min_tokens", f"min_tokens must be an integer >= 0, got {self.min_tokens!r}")
        if self.min_tokens > self.max_tokens:
            raise InvalidParameterError("min_tokens", "min_tokens must not exceed max_tokens")
        if len(self.stop) > _MAX_STOP_STRINGS:
            raise InvalidParameterError("stop", f"at most {_MAX_STOP_STRINGS} stop strings are allowed")
        for s in self.stop:
            if not isinstance(s, str) or not s:
                raise InvalidParameterError("stop", f"stop strings must be non-empty strings, got {s!r}")
        for t in self.stop_token_ids:
            if isinstance(t, bool) or not isinstance(t, int) or t < 0:
                raise InvalidParameterError("stop_token_ids", f"stop_token_ids must be non-negative integers, got {t!r}")

        for name in ("logprobs", "prompt_logprobs"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_TOP_LOGPROBS):
                raise InvalidParameterError(name, f"{name} must be an integer in [0, {MAX_TOP_LOGPROBS}] "
                                                  f"(the number of top alternatives), got {v!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def _is_number(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x == x  # rejects NaN
