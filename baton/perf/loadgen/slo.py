"""Per-lane service-level objectives the load generator scores requests against.

Defaults mirror the lanes of ``baton/default_config.yaml`` (kept in sync by a test); a run
overrides them with ``--slo lane:ttft=MS,tpot=MS``. A lane without an SLO here (a custom lane of
a custom config) gets the interactive lane's.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LaneSLO:
    ttft_s: float
    tpot_s: float

    def __post_init__(self) -> None:
        if not (self.ttft_s > 0 and self.tpot_s > 0):
            raise ValueError(f"SLOs must be > 0, got ttft={self.ttft_s} s, tpot={self.tpot_s} s")

    def to_dict(self) -> dict[str, float]:
        return {"ttft_s": self.ttft_s, "tpot_s": self.tpot_s}


DEFAULT_SLOS: dict[str, LaneSLO] = {
    "interactive": LaneSLO(ttft_s=2.0, tpot_s=0.25),
    "batch": LaneSLO(ttft_s=600.0, tpot_s=5.0),
    "long_context": LaneSLO(ttft_s=60.0, tpot_s=0.5),
}
FALLBACK_LANE = "interactive"


def parse_slo(text: str) -> tuple[str, dict[str, float]]:
    """``lane:ttft=MS,tpot=MS`` (either key may be omitted) -> (lane, {"ttft_s"?, "tpot_s"?})."""
    lane, sep, rest = text.partition(":")
    if not sep or not lane or not rest:
        raise ValueError(f"--slo must be LANE:ttft=MS,tpot=MS, got {text!r}")
    out: dict[str, float] = {}
    for part in rest.split(","):
        key, eq, value = part.partition("=")
        key = key.strip().lower()
        if not eq or key not in ("ttft", "tpot"):
            raise ValueError(f"--slo {text!r}: expected ttft=MS or tpot=MS, got {part!r}")
        try:
            ms = float(value)
        except ValueError:
            raise ValueError(f"--slo {text!r}: {key} must be a number of milliseconds, got {value!r}") from None
        if not ms > 0:
            raise ValueError(f"--slo {text!r}: {key} must be > 0 ms")
        out[f"{key}_s"] = ms / 1000.0
    return lane, out


def resolve_slos(lanes: list[str] | tuple[str, ...], overrides: list[str] | tuple[str, ...] = ()) -> dict[str, LaneSLO]:
    """The SLO of every lane of a workload: defaults, then ``--slo`` overrides in order."""
    slos = {lane: DEFAULT_SLOS.get(lane, DEFAULT_SLOS[FALLBACK_LANE]) for lane in lanes}
    for text in overrides:
        lane, fields = parse_slo(text)
        if lane not in slos:  # a typo would otherwise score the run against the default silently
            raise ValueError(f"--slo {text!r}: the workload has no lane {lane!r}; its lanes: {', '.join(lanes)}")
        base = slos[lane]
        slos[lane] = LaneSLO(ttft_s=fields.get("ttft_s", base.ttft_s), tpot_s=fields.get("tpot_s", base.tpot_s))
    return slos
