"""Traffic-class lanes and tenants (pure Python, validated where built).

A lane is a class of traffic with its own service objectives: how fast its first token must come
(TTFT SLO) and how fast tokens must follow (TPOT SLO), its share of dispatch (weight), its
importance inside the workers' schedulers (priority: lower is more important; it decides admission
order and preemption victims there), how many requests may wait for it in the router (queue
bound), how long the router may hold its requests to dispatch them denser (batch window), and
whether admitted requests are journaled in Redis to survive a router restart (durable).
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass, field


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


@dataclass(frozen=True)
class LaneConfig:
    name: str
    ttft_slo_s: float
    tpot_slo_s: float
    weight: float = 1.0
    priority: int = 0
    queue_bound: int = 256
    preemptible: bool = False
    batch_window_s: float = 0.0
    durable: bool = False
    decode_floor: float = 0.05  # its least share of decode slots while it has demand (engine/lane_shares.py)

    def __post_init__(self) -> None:
        _check(
            bool(self.name) and self.name.replace("_", "").replace("-", "").isalnum(),
            f"lane name must be alphanumeric (with - or _), got {self.name!r}",
        )
        _check(self.ttft_slo_s > 0, f"lane {self.name}: ttft_slo_s must be > 0")
        _check(self.tpot_slo_s > 0, f"lane {self.name}: tpot_slo_s must be > 0")
        _check(self.weight > 0, f"lane {self.name}: weight must be > 0")
        _check(self.queue_bound >= 1, f"lane {self.name}: queue_bound must be >= 1")
        _check(self.batch_window_s >= 0, f"lane {self.name}: batch_window_s must be >= 0")
        _check(0 <= self.decode_floor < 1, f"lane {self.name}: decode_floor must be in [0, 1)")


def default_lanes() -> tuple[LaneConfig, ...]:
    return (
        LaneConfig("interactive", ttft_slo_s=2.0, tpot_slo_s=0.25, weight=8.0, priority=0, queue_bound=128),
        LaneConfig(
            "batch",
            ttft_slo_s=600.0,
            tpot_slo_s=5.0,
            weight=1.0,
            priority=2,
            queue_bound=4096,
            preemptible=True,
            batch_window_s=0.5,
            durable=True,
        ),
        LaneConfig("long_context", ttft_slo_s=60.0, tpot_slo_s=0.5, weight=2.0, priority=1, queue_bound=64),
    )


@dataclass(frozen=True)
class TenantConfig:
    name: str
    api_key: str | None = None  # resolved secret (configs reference env vars / files, never inline keys)
    allowed_lanes: tuple[str, ...] | None = None  # None: every lane
    default_lane: str | None = None
    requests_per_min: float | None = None
    tokens_per_min: float | None = None

    def __post_init__(self) -> None:
        _check(bool(self.name), "tenant name must not be empty")
        for v, n in ((self.requests_per_min, "requests_per_min"), (self.tokens_per_min, "tokens_per_min")):
            _check(v is None or v > 0, f"tenant {self.name}: {n} must be > 0 or unset")

    def may_use(self, lane: str) -> bool:
        return self.allowed_lanes is None or lane in self.allowed_lanes


@dataclass(frozen=True)
class ClassificationRules:
    """How a request without an explicit or default lane is classified."""

    long_context_tokens: int = 4096  # prompts at least this long -> long_context
    batch_min_max_tokens: int = 1024  # non-streaming requests asking for this many tokens (or no bound) -> batch
    default_lane: str = "interactive"


@dataclass(frozen=True)
class LanePolicy:
    lanes: tuple[LaneConfig, ...] = field(default_factory=default_lanes)
    tenants: tuple[TenantConfig, ...] = (TenantConfig("default"),)
    rules: ClassificationRules = ClassificationRules()
    auth_required: bool = False

    def __post_init__(self) -> None:
        names = [lane.name for lane in self.lanes]
        _check(
            len(names) == len(set(names)) and len(names) > 0, "lane names must be unique and at least one lane defined"
        )
        _check(self.rules.default_lane in names, f"rules.default_lane {self.rules.default_lane!r} is not a lane")
        keys = [t.api_key for t in self.tenants if t.api_key]
        _check(len(keys) == len(set(keys)), "two tenants share an API key")
        for t in self.tenants:
            for lane in (t.allowed_lanes or ()) + ((t.default_lane,) if t.default_lane else ()):
                _check(lane in names, f"tenant {t.name}: unknown lane {lane!r}")
        _check(not self.auth_required or len(keys) > 0, "auth_required needs at least one tenant with an API key")

    def lane(self, name: str) -> LaneConfig:
        for lane in self.lanes:
            if lane.name == name:
                return lane
        raise KeyError(name)

    def tenant_for_key(self, api_key: str | None) -> TenantConfig | None:
        """The tenant a request's key names; None when it names none and authentication requires one.

        With authentication off, a key that matches no tenant is taken as no key at all (the keyless
        tenant serves it), as vLLM does without ``--api-key``: OpenAI's client always sends some key,
        and refusing it would turn away every client that was never told one."""
        if api_key:
            # Constant time: ``==`` stops at the first differing character, so its timing would tell
            # a caller how much of a guessed key is right. Every tenant is compared, with no early
            # exit, so neither does the time say which tenant matched.
            given = api_key.encode("utf-8", "surrogatepass")
            found = None
            for t in self.tenants:
                if t.api_key and hmac.compare_digest(t.api_key.encode("utf-8", "surrogatepass"), given):
                    found = t
            if found is not None or self.auth_required:
                return found
        return next((t for t in self.tenants if t.api_key is None), None)
