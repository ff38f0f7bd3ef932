"""Serving workloads: what requests a load generator sends, and when.

A ``WorkloadSpec`` describes a traffic mix (lane shares, prompt and output length distributions,
shared-prefix groups, the arrival process); ``arrivals.plan_requests`` turns it into a concrete,
seeded list of ``PlannedRequest``s for a rate and a duration. The same plan drives the real load
generator (``baton.perf.loadgen``) and the discrete-event simulator, so both see identical traffic.

Pure Python (no numpy, no torch): a plan must be bit-identical in every process and on every
platform, so it is drawn only with ``random.Random``, whose draws the language specifies.

Conventions:
- ``PlannedRequest.prompt_len`` is the *whole* prompt, shared prefix included; a request in a
  prefix group starts with that group's ``prefix_len`` tokens, then ``input_len`` unique tokens.
- ``output_len`` is exact: clients send ``max_tokens = output_len`` with ``ignore_eos``.
- Arrivals are a renewal process (Poisson, or gamma with shape k: inter-arrival CV = 1/sqrt(k))
  at unit rate, mapped onto wall time through the cumulative rate, so a ``Burst`` multiplies the
  instantaneous rate inside its window without changing the process's shape.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

LengthKind = Literal["sharegpt", "fixed", "uniform"]
ArrivalKind = Literal["poisson", "gamma"]
_LENGTH_KINDS = ("sharegpt", "fixed", "uniform")
_ARRIVALS = ("poisson", "gamma")


@dataclass(frozen=True)
class LengthDist:
    """A token-length distribution.

    - ``fixed``: always ``value``.
    - ``uniform``: an integer uniform in ``[low, high]`` (inclusive).
    - ``sharegpt``: lognormal with mean ``mean`` and log-space std ``sigma`` (ShareGPT's prompt
      and answer lengths are close to lognormal: many short turns, a long tail), rounded and
      clipped to ``[low, high]`` so a request always fits the model's context.
    """

    kind: LengthKind
    value: int = 0
    low: int = 1
    high: int = 1
    mean: float = 0.0
    sigma: float = 1.0

    def __post_init__(self) -> None:
        if self.kind not in _LENGTH_KINDS:
            raise ValueError(f"length kind must be one of {_LENGTH_KINDS}, got {self.kind!r}")
        if self.kind == "fixed" and self.value < 1:
            raise ValueError(f"a fixed length needs value >= 1, got {self.value}")
        if self.kind in ("uniform", "sharegpt") and not 1 <= self.low <= self.high:
            raise ValueError(f"a {self.kind} length needs 1 <= low <= high, got low={self.low} high={self.high}")
        if self.kind == "sharegpt" and (self.mean <= 0 or self.sigma < 0):
            raise ValueError(
                f"a sharegpt length needs mean > 0 and sigma >= 0, got mean={self.mean} sigma={self.sigma}"
            )

    @staticmethod
    def fixed(value: int) -> LengthDist:
        return LengthDist(kind="fixed", value=value, low=value, high=value)

    @staticmethod
    def uniform(low: int, high: int) -> LengthDist:
        return LengthDist(kind="uniform", low=low, high=high)

    @staticmethod
    def sharegpt(mean: float, low: int, high: int, sigma: float = 1.0) -> LengthDist:
        return LengthDist(kind="sharegpt", mean=mean, low=low, high=high, sigma=sigma)

    def sample(self, rng: random.Random) -> int:
        if self.kind == "fixed":
            return self.value
        if self.kind == "uniform":
            return rng.randint(self.low, self.high)
        # E[lognormal(mu, s)] = exp(mu + s^2/2): choose mu so the unclipped mean is `mean`.
        mu = math.log(self.mean) - self.sigma * self.sigma / 2.0
        return min(max(round(rng.lognormvariate(mu, self.sigma)), self.low), self.high)

    @property
    def max_value(self) -> int:
        return self.value if self.kind == "fixed" else self.high

    def to_dict(self) -> dict[str, Any]:
        if self.kind == "fixed":
            return {"kind": "fixed", "value": self.value}
        if self.kind == "uniform":
            return {"kind": "uniform", "low": self.low, "high": self.high}
        return {"kind": "sharegpt", "mean": self.mean, "sigma": self.sigma, "low": self.low, "high": self.high}


@dataclass(frozen=True)
class WorkloadSpec:
    """A traffic mix. ``lanes`` maps lane name (as in the router config) to its share of requests.

    ``lane_input_len`` / ``lane_output_len`` optionally override the length distributions for one
    lane (e.g. a batch lane with long answers next to short interactive turns).
    """

    name: str
    lanes: dict[str, float]
    input_len: LengthDist
    output_len: LengthDist
    prefix_groups: int = 0
    prefix_len: int = 0
    arrival: ArrivalKind = "poisson"
    gamma_shape: float = 1.0
    streaming: bool = True
    lane_input_len: dict[str, LengthDist] = field(default_factory=dict)
    lane_output_len: dict[str, LengthDist] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.lanes:
            raise ValueError("lanes: a workload needs at least one lane")
        for lane, share in self.lanes.items():
            if not isinstance(lane, str) or not lane:
                raise ValueError(f"lanes: lane names must be non-empty strings, got {lane!r}")
            if not isinstance(share, (int, float)) or isinstance(share, bool) or share < 0:
                raise ValueError(f"lanes: the share of lane {lane!r} must be a number >= 0, got {share!r}")
        if abs(sum(self.lanes.values()) - 1.0) > 1e-6:
            raise ValueError(f"lanes: shares must sum to 1, got {sum(self.lanes.values())}")
        for what, overrides in (("lane_input_len", self.lane_input_len), ("lane_output_len", self.lane_output_len)):
            for lane in overrides:
                if lane not in self.lanes:
                    raise ValueError(f"{what}: lane {lane!r} is not in lanes {sorted(self.lanes)}")
        if self.prefix_groups < 0 or self.prefix_len < 0:
            raise ValueError("prefix_groups and prefix_len must be >= 0")
        if self.prefix_groups > 0 and self.prefix_len < 1:
            raise ValueError("prefix_len: must be >= 1 when prefix_groups > 0")
        if self.arrival not in _ARRIVALS:
            raise ValueError(f"arrival: must be one of {_ARRIVALS}, got {self.arrival!r}")
        if not self.gamma_shape > 0:
            raise ValueError(f"gamma_shape: must be > 0, got {self.gamma_shape}")

    def input_dist(self, lane: str) -> LengthDist:
        return self.lane_input_len.get(lane, self.input_len)

    def output_dist(self, lane: str) -> LengthDist:
        return self.lane_output_len.get(lane, self.output_len)

    def max_total_len(self) -> int:
        """The longest request (prompt + output) this workload can produce."""
        return max(
            self.prefix_len + self.input_dist(lane).max_value + self.output_dist(lane).max_value for lane in self.lanes
        )

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "name": self.name,
            "lanes": dict(self.lanes),
            "input_len": self.input_len.to_dict(),
            "output_len": self.output_len.to_dict(),
            "prefix_groups": self.prefix_groups,
            "prefix_len": self.prefix_len,
            "arrival": self.arrival,
            "gamma_shape": self.gamma_shape,
            "streaming": self.streaming,
        }
        if self.lane_input_len:
            d["lane_input_len"] = {k: v.to_dict() for k, v in self.lane_input_len.items()}
        if self.lane_output_len:
            d["lane_output_len"] = {k: v.to_dict() for k, v in self.lane_output_len.items()}
        return d


# -- builtin workloads ---------------------------------------------------------------------------
# Sized for a 2-core CPU running SmolLM2-135M: prompts of a few hundred tokens, answers of tens.
def _builtin(name: str) -> WorkloadSpec | None:
    chat_in = LengthDist.sharegpt(mean=200, sigma=0.9, low=8, high=1024)
    chat_out = LengthDist.sharegpt(mean=64, sigma=0.8, low=4, high=256)
    if name == "sharegpt":
        return WorkloadSpec(name, {"interactive": 1.0}, chat_in, chat_out)
    if name == "fixed":
        return WorkloadSpec(name, {"interactive": 1.0}, LengthDist.fixed(128), LengthDist.fixed(32))
    if name == "uniform":
        return WorkloadSpec(name, {"interactive": 1.0}, LengthDist.uniform(32, 384), LengthDist.uniform(8, 96))
    if name == "mixed":
        # Interactive chat turns next to background jobs with longer prompts and answers.
        return WorkloadSpec(
            name,
            {"interactive": 0.7, "batch": 0.3},
            chat_in,
            chat_out,
            lane_input_len={"batch": LengthDist.sharegpt(mean=400, sigma=0.6, low=64, high=1536)},
            lane_output_len={"batch": LengthDist.sharegpt(mean=128, sigma=0.5, low=16, high=384)},
        )
    if name == "shared-prefix":
        # A few long system prompts shared by many short questions: prefix caching's best case.
        return WorkloadSpec(
            name,
            {"interactive": 1.0},
            LengthDist.uniform(16, 64),
            LengthDist.fixed(32),
            prefix_groups=4,
            prefix_len=512,
        )
    return None


BUILTIN_WORKLOADS: tuple[str, ...] = ("sharegpt", "fixed", "uniform", "mixed", "shared-prefix")


# -- parsing -------------------------------------------------------------------------------------
def _length_from(obj: Any, where: str) -> LengthDist:
    if isinstance(obj, int) and not isinstance(obj, bool):
        return LengthDist.fixed(obj)  # shorthand: `output_len: 32`
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: expected an object with 'kind' (or an integer), got {type(obj).__name__}")
    allowed = {"kind", "value", "low", "high", "mean", "sigma"}
    unknown = sorted(set(obj) - allowed)
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {unknown}; allowed: {sorted(allowed)}")
    kind = obj.get("kind")
    if kind not in _LENGTH_KINDS:
        raise ValueError(f"{where}.kind: must be one of {_LENGTH_KINDS}, got {kind!r}")
    for key in ("value", "low", "high"):
        if key in obj and (not isinstance(obj[key], int) or isinstance(obj[key], bool)):
            raise ValueError(f"{where}.{key}: expected an integer, got {obj[key]!r}")
    for key in ("mean", "sigma"):
        if key in obj and (not isinstance(obj[key], (int, float)) or isinstance(obj[key], bool)):
            raise ValueError(f"{where}.{key}: expected a number, got {obj[key]!r}")
    needed = {"fixed": ("value",), "uniform": ("low", "high"), "sharegpt": ("mean", "low", "high")}[kind]
    for key in needed:
        if key not in obj:
            raise ValueError(f"{where}.{key}: required for a {kind} length")
    try:
        if kind == "fixed":
            return LengthDist.fixed(obj["value"])
        if kind == "uniform":
            return LengthDist.uniform(obj["low"], obj["high"])
        return LengthDist.sharegpt(float(obj["mean"]), obj["low"], obj["high"], float(obj.get("sigma", 1.0)))
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None


def workload_from_dict(data: Any, default_name: str = "custom") -> WorkloadSpec:
    """A validated ``WorkloadSpec`` from parsed YAML/JSON; a ValueError names the offending field."""
    if not isinstance(data, dict):
        raise ValueError(f"a workload file must hold a mapping, got {type(data).__name__}")
    known = {f.name for f in fields(WorkloadSpec)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"unknown workload field(s) {unknown}; allowed: {sorted(known)}")
    for key in ("lanes", "input_len", "output_len"):
        if key not in data:
            raise ValueError(f"{key}: required")
    lanes = data["lanes"]
    if isinstance(lanes, list):  # `lanes: [interactive]` = equal shares
        lanes = {str(lane): 1.0 / len(lanes) for lane in lanes} if lanes else {}
    if not isinstance(lanes, dict):
        raise ValueError(f"lanes: expected a mapping lane -> share, got {type(lanes).__name__}")
    ints = {"prefix_groups", "prefix_len"}
    for key in ints:
        if key in data and (not isinstance(data[key], int) or isinstance(data[key], bool)):
            raise ValueError(f"{key}: expected an integer, got {data[key]!r}")
    if "gamma_shape" in data and (
        not isinstance(data["gamma_shape"], (int, float)) or isinstance(data["gamma_shape"], bool)
    ):
        raise ValueError(f"gamma_shape: expected a number, got {data['gamma_shape']!r}")
    if "streaming" in data and not isinstance(data["streaming"], bool):
        raise ValueError(f"streaming: expected a boolean, got {data['streaming']!r}")
    if "name" in data and not isinstance(data["name"], str):
        raise ValueError(f"name: expected a string, got {data['name']!r}")
    overrides = {}
    for key in ("lane_input_len", "lane_output_len"):
        raw = data.get(key, {})
        if not isinstance(raw, dict):
            raise ValueError(f"{key}: expected a mapping lane -> length, got {type(raw).__name__}")
        overrides[key] = {str(lane): _length_from(v, f"{key}.{lane}") for lane, v in raw.items()}
    return WorkloadSpec(
        name=data.get("name", default_name),
        lanes={str(k): v for k, v in lanes.items()},
        input_len=_length_from(data["input_len"], "input_len"),
        output_len=_length_from(data["output_len"], "output_len"),
        prefix_groups=data.get("prefix_groups", 0),
        prefix_len=data.get("prefix_len", 0),
        arrival=data.get("arrival", "poisson"),
        gamma_shape=float(data.get("gamma_shape", 1.0)),
        streaming=data.get("streaming", True),
        **overrides,
    )


def load_workload(name_or_path: str) -> WorkloadSpec:
    """A builtin workload by name, or a YAML/JSON workload file (see ``workload_from_dict``)."""
    spec = _builtin(name_or_path)
    if spec is not None:
        return spec
    path = Path(name_or_path)
    if not path.is_file():
        raise ValueError(
            f"unknown workload {name_or_path!r}: not a builtin ({', '.join(BUILTIN_WORKLOADS)}) and not a file"
        )
    text = path.read_text()
    try:
        if path.suffix == ".json":
            data = json.loads(text)
        else:
            import yaml  # YAML is a superset of JSON: one parser for everything else

            data = yaml.safe_load(text)
    except Exception as e:  # noqa: BLE001 - any parse failure is the file's fault
        raise ValueError(f"{path}: not valid {'JSON' if path.suffix == '.json' else 'YAML'}: {e}") from None
    try:
        return workload_from_dict(data, default_name=path.stem)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None
