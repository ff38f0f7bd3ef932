"""Per-request sampling parameters, validated where they are built (torch-free)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from engine.errors import InvalidParameterError
from engine.logprobs import MAX_TOP_LOGPROBS
from engine.structured.constraint import StructuredOutput

_MAX_STOP_STRINGS = 16
_MAX_LOGIT_BIAS = 1024
MAX_STOP_TOKEN_IDS = 1024  # each is checked against every generated token
# Past these the float32 logits overflow: a temperature near float32's largest value turns the
# -inf of masked tokens into NaN (-inf / inf), and a tiny repetition penalty turns a positive
# logit into inf; softmax then gives a NaN row, and the sampler picked token 0.
MAX_TEMPERATURE = 1e6
MIN_REPETITION_PENALTY = 0.01
_FLAGS = ("ignore_eos", "include_stop_str_in_output", "detokenize", "skip_special_tokens")


def _first(pair: tuple[int, float]) -> int:
    """Sort key of a logit_bias pair (a malformed one sorts first; validation rejects it)."""
    return pair[0] if pair and isinstance(pair[0], int) else -1


GREEDY_BELOW = 1e-5

# What the constructor takes for its sequence fields (it stores them as tuples): JSON gives lists, a
# lone stop string stands for one stop, and logit_bias comes as OpenAI's {token id: bias}.
StopStrings = str | list[str] | tuple[str, ...]
TokenIds = list[int] | tuple[int, ...]
LogitBias = Mapping[int, float] | list[tuple[int, float]] | tuple[tuple[int, float], ...]
_KIND_NAMES: dict[type, str] = {Mapping: "dict"}


@dataclass(frozen=True, slots=True, init=False)
class SamplingParams:
    """How to turn logits into tokens for one request.

    ``temperature == 0`` (or below ``GREEDY_BELOW``) is greedy. ``top_k == 0``, ``top_p == 1`` and
    ``min_p == 0`` disable those filters (``min_p``: drop tokens less likely than ``min_p`` times
    the most likely one).
    ``seed`` makes a sampled request reproducible regardless of what it is batched with.
    ``logprobs``: None reports none; n >= 0 reports each generated token's logprob and the n most
    likely tokens at its position (engine/logprobs.py). ``prompt_logprobs``: the same for every
    prompt token after the first (the prompt is then computed whole: no prefix-cache hits).
    ``presence_penalty`` / ``frequency_penalty`` (OpenAI's, over the generated tokens),
    ``repetition_penalty`` (vLLM's and transformers', over prompt and generated tokens; 1 is off)
    and ``logit_bias`` ((token id, bias) pairs; a dict is accepted) reshape the logits before
    sampling, greedy included (engine/logits_processing.py). ``structured``: a constraint the output
    must match (engine/structured/), applied as a token mask wherever a token is chosen.
    """

    max_tokens: int
    temperature: float
    top_p: float
    top_k: int
    min_p: float
    seed: int | None
    stop: tuple[str, ...]
    stop_token_ids: tuple[int, ...]
    ignore_eos: bool
    min_tokens: int
    include_stop_str_in_output: bool
    detokenize: bool
    skip_special_tokens: bool
    logprobs: int | None
    prompt_logprobs: int | None
    presence_penalty: float
    frequency_penalty: float
    repetition_penalty: float
    logit_bias: tuple[tuple[int, float], ...]
    structured: StructuredOutput | None

    def __init__(
        self,
        max_tokens: int = 16,
        temperature: float = 0.0,
        top_p: float = 1.0,
        top_k: int = 0,
        min_p: float = 0.0,
        seed: int | None = None,
        stop: StopStrings = (),
        stop_token_ids: TokenIds = (),
        ignore_eos: bool = False,
        min_tokens: int = 0,
        include_stop_str_in_output: bool = False,
        detokenize: bool = True,
        skip_special_tokens: bool = True,
        logprobs: int | None = None,
        prompt_logprobs: int | None = None,
        presence_penalty: float = 0.0,
        frequency_penalty: float = 0.0,
        repetition_penalty: float = 1.0,
        logit_bias: LogitBias = (),
        structured: StructuredOutput | None = None,
    ) -> None:
        # Written out rather than generated: it takes the shapes JSON and callers hand over (lists, a
        # lone stop string, a dict of biases) as typed arguments, while the fields keep tuples (hashable).
        set_ = object.__setattr__
        set_(self, "max_tokens", max_tokens)
        set_(self, "temperature", temperature)
        set_(self, "top_p", top_p)
        set_(self, "top_k", top_k)
        set_(self, "min_p", min_p)
        set_(self, "seed", seed)
        set_(self, "ignore_eos", ignore_eos)
        set_(self, "min_tokens", min_tokens)
        set_(self, "include_stop_str_in_output", include_stop_str_in_output)
        set_(self, "detokenize", detokenize)
        set_(self, "skip_special_tokens", skip_special_tokens)
        set_(self, "logprobs", logprobs)
        set_(self, "prompt_logprobs", prompt_logprobs)
        set_(self, "presence_penalty", presence_penalty)
        set_(self, "frequency_penalty", frequency_penalty)
        set_(self, "repetition_penalty", repetition_penalty)
        set_(self, "structured", structured)
        # Types first: the normalization below iterates these (5 gave "'int' object is not iterable").
        for name, v, kinds in (
            ("stop", stop, (str, list, tuple)),
            ("stop_token_ids", stop_token_ids, (list, tuple)),
            ("logit_bias", logit_bias, (Mapping, list, tuple)),
        ):
            if v is not None and not isinstance(v, kinds):
                allowed = " or ".join(_KIND_NAMES.get(k, k.__name__) for k in kinds)
                raise InvalidParameterError(name, f"{name} must be a {allowed}, got {type(v).__name__}")
        set_(self, "stop", (stop,) if isinstance(stop, str) else tuple(stop or ()))
        set_(self, "stop_token_ids", tuple(stop_token_ids or ()))
        bias = logit_bias.items() if isinstance(logit_bias, Mapping) else (logit_bias or ())
        pairs = tuple(tuple(b) if isinstance(b, (list, tuple)) else (b,) for b in bias)  # (b,): rejected below
        set_(self, "logit_bias", tuple(sorted(pairs, key=_first)))
        self._validate()

    def _validate(self) -> None:
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int) or self.max_tokens <= 0:
            raise InvalidParameterError("max_tokens", f"max_tokens must be a positive integer, got {self.max_tokens!r}")
        if not _is_number(self.temperature) or not 0 <= self.temperature <= MAX_TEMPERATURE:
            raise InvalidParameterError(
                "temperature", f"temperature must be in [0, {MAX_TEMPERATURE:g}], got {self.temperature!r}"
            )
        if not _is_number(self.top_p) or not 0 < self.top_p <= 1:
            raise InvalidParameterError("top_p", f"top_p must be in (0, 1], got {self.top_p!r}")
        if not _is_number(self.min_p) or not 0 <= self.min_p <= 1:
            raise InvalidParameterError("min_p", f"min_p must be in [0, 1], got {self.min_p!r}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise InvalidParameterError("top_k", f"top_k must be an integer >= 0 (0 disables it), got {self.top_k!r}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise InvalidParameterError("seed", f"seed must be an integer, got {self.seed!r}")
        if self.seed is not None and not -(2**63) <= self.seed < 2**64:  # (wider ones wrapped onto others)
            raise InvalidParameterError("seed", f"seed must fit in 64 bits, got {self.seed}")
        if isinstance(self.min_tokens, bool) or not isinstance(self.min_tokens, int) or self.min_tokens < 0:
            raise InvalidParameterError("min_tokens", f"min_tokens must be an integer >= 0, got {self.min_tokens!r}")
        if self.min_tokens > self.max_tokens:
            raise InvalidParameterError("min_tokens", "min_tokens must not exceed max_tokens")
        if len(self.stop) > _MAX_STOP_STRINGS:
            raise InvalidParameterError("stop", f"at most {_MAX_STOP_STRINGS} stop strings are allowed")
        for s in self.stop:
            if not isinstance(s, str) or not s:
                raise InvalidParameterError("stop", f"stop strings must be non-empty strings, got {s!r}")
        if len(self.stop_token_ids) > MAX_STOP_TOKEN_IDS:
            raise InvalidParameterError(
                "stop_token_ids",
                f"stop_token_ids may hold at most {MAX_STOP_TOKEN_IDS} token ids, got {len(self.stop_token_ids)}",
            )
        for t in self.stop_token_ids:
            if isinstance(t, bool) or not isinstance(t, int) or t < 0:
                raise InvalidParameterError(
                    "stop_token_ids", f"stop_token_ids must be non-negative integers, got {t!r}"
                )
        for name in _FLAGS:  # a truthy "no" was read as True
            if not isinstance(getattr(self, name), bool):
                raise InvalidParameterError(name, f"{name} must be true or false, got {getattr(self, name)!r}")
        if self.stop and not self.detokenize:  # stop strings are matched in the detokenized text
            raise InvalidParameterError("stop", "stop strings need detokenize=True (there is no text to match)")

        for name in ("presence_penalty", "frequency_penalty"):
            v = getattr(self, name)
            if not _is_number(v) or not -2 <= v <= 2:
                raise InvalidParameterError(name, f"{name} must be a number in [-2, 2], got {v!r}")
        if not _is_number(self.repetition_penalty) or not MIN_REPETITION_PENALTY <= self.repetition_penalty <= 10:
            raise InvalidParameterError(
                "repetition_penalty",
                f"repetition_penalty must be in "
                f"[{MIN_REPETITION_PENALTY}, 10] (1 is off), got {self.repetition_penalty!r}",
            )
        if len(self.logit_bias) > _MAX_LOGIT_BIAS:
            raise InvalidParameterError("logit_bias", f"logit_bias may bias at most {_MAX_LOGIT_BIAS} tokens")
        for entry in self.logit_bias:
            if (
                len(entry) != 2
                or isinstance(entry[0], bool)
                or not isinstance(entry[0], int)
                or entry[0] < 0
                or not _is_number(entry[1])
                or not -100 <= entry[1] <= 100
            ):
                raise InvalidParameterError(
                    "logit_bias", f"logit_bias maps token ids (integers >= 0) to biases in [-100, 100], got {entry!r}"
                )
        if len({t for t, _ in self.logit_bias}) != len(self.logit_bias):
            raise InvalidParameterError("logit_bias", "logit_bias names a token twice")
        if self.structured is not None and not isinstance(self.structured, StructuredOutput):
            raise InvalidParameterError("structured", f"structured must be a StructuredOutput, got {self.structured!r}")
        for name in ("logprobs", "prompt_logprobs"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_TOP_LOGPROBS):
                raise InvalidParameterError(
                    name,
                    f"{name} must be an integer in [0, {MAX_TOP_LOGPROBS}] (the number of top alternatives), got {v!r}",
                )

    @property
    def greedy(self) -> bool:
        """Temperatures below ``GREEDY_BELOW`` sample greedily (as vLLM's): dividing logits by a
        subnormal temperature overflows to inf, and the softmax of that is NaN."""
        return self.temperature < GREEDY_BELOW

    def check_vocabulary(self, vocab_size: int) -> None:
        """The token ids these parameters name (``logit_bias``, ``stop_token_ids``) exist in a
        vocabulary of ``vocab_size``; else InvalidParameterError naming the parameter."""
        for name, ids in (("logit_bias", [t for t, _ in self.logit_bias]), ("stop_token_ids", self.stop_token_ids)):
            bad = next((t for t in ids if t >= vocab_size), None)
            if bad is not None:
                raise InvalidParameterError(name, f"{name} token id {bad} is outside the vocabulary [0, {vocab_size})")

    @property
    def processes_logits(self) -> bool:
        """Whether penalties, a logit bias or ``min_tokens`` (which masks the stop tokens until then)
        reshape the logits before sampling."""
        masks_stops = self.min_tokens > 0 and (bool(self.stop_token_ids) or not self.ignore_eos)
        return (
            bool(self.logit_bias)
            or self.repetition_penalty != 1.0
            or bool(self.presence_penalty)
            or bool(self.frequency_penalty)
            or masks_stops
        )


def _is_number(x: object) -> bool:
    """A finite int or float (not a bool, NaN, inf, or an int too large for a float)."""
    if not isinstance(x, (int, float)) or isinstance(x, bool):
        return False
    try:
        return math.isfinite(x)
    except OverflowError:  # 10**400
        return False
