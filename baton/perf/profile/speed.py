"""The machine's speed right now, against a cost model: a few seconds of fixed steps (torch).

A cost model is the machine at the time of ``baton profile``. On a shared VM that time does not
last: on the 2-vCPU machine this project is developed on, the same decode step took 24 ms at one
profile and 32 ms an hour later, while prefill steps moved by 7% (decode steps stream the weights
from memory, so they feel the neighbours' memory traffic; prefill steps are compute-bound). A
simulator replaying an experiment with the profile's step times then predicts a machine that was
not there.

A speed probe times a handful of steps the profile also measured, on an engine configured as a
worker is, and reports two ratios, measured typical step / the cost model's typical step, one for
decode steps and one for prefill steps. Experiments run it next to each run
(``--speed-probe COST_MODEL``), and ``baton.perf.sim.validate`` replays each run on the machine its
probes measured (the simulator's ``step_scale`` / ``prefill_step_scale``). The probe measures the
machine; it never looks at the latencies it is later compared with.

    python -m baton.perf.profile.speed --cost-model cost_model.json [--model PATH] [--json OUT]

JSON (``baton.speed_probe/1``)::

    {schema, reference, at_unix, seconds, decode, prefill, points: [{label, kind, measured_s, predicted_s}]}

``reference`` is the cost model's ``created`` stamp: a ratio means nothing against another profile.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field

SCHEMA = "baton.speed_probe/1"

# (kind, rows or new tokens, context): short steps of the kinds a CPU worker runs most, each of
# them also on the profile's grid (so the fit is not extrapolating where the ratio is taken).
PROBES: tuple[tuple[str, int, int], ...] = (
    ("decode", 1, 64),
    ("decode", 4, 256),
    ("decode", 16, 64),
    ("prefill", 256, 0),
    ("prefill", 512, 0),
)


@dataclass(frozen=True)
class ProbePoint:
    label: str
    kind: str  # "decode" | "prefill"
    measured_s: float  # the median repeat
    predicted_s: float  # the cost model's typical step for the same shape


@dataclass(frozen=True)
class SpeedProbe:
    """Measured / predicted step time, per kind (1.0: the machine the profile saw; 1.3: 30% slower)."""

    decode: float
    prefill: float
    reference: str = ""  # the cost model's ``created``
    at_unix: float = 0.0
    seconds: float = 0.0  # how long the probe took
    points: tuple[ProbePoint, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        for name in ("decode", "prefill"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ValueError(f"speed probe: {name} must be a finite number > 0, got {v!r}")

    def to_json(self) -> dict:
        d = asdict(self)
        d["schema"] = SCHEMA
        d["points"] = [asdict(p) for p in self.points]
        return d

    @classmethod
    def from_json(cls, d: dict) -> SpeedProbe:
        if not isinstance(d, dict) or d.get("schema") != SCHEMA:
            raise ValueError(
                f"not a speed probe (schema {d.get('schema') if isinstance(d, dict) else d!r}, expected {SCHEMA!r})"
            )
        return cls(
            float(d["decode"]),
            float(d["prefill"]),
            str(d.get("reference", "")),
            float(d.get("at_unix", 0.0)),
            float(d.get("seconds", 0.0)),
            tuple(ProbePoint(**p) for p in d.get("points", [])),
        )


def ratios(points: list[ProbePoint]) -> tuple[float, float]:
    """(decode, prefill): the geometric mean of measured / predicted over each kind's points."""
    out = []
    for kind in ("decode", "prefill"):
        rs = [p.measured_s / p.predicted_s for p in points if p.kind == kind and p.predicted_s > 0]
        if not rs:
            raise ValueError(f"speed probe: no {kind} point")
        out.append(math.exp(statistics.fmean(math.log(r) for r in rs)))
    return out[0], out[1]


def mean_probe(probes: list[SpeedProbe]) -> SpeedProbe | None:
    """The machine over a run: the mean of the probes taken before and after it (None if none)."""
    if not probes:
        return None
    refs = {p.reference for p in probes}
    if len(refs) > 1:
        raise ValueError(f"speed probes against different cost models: {sorted(refs)}")
    return SpeedProbe(
        statistics.fmean(p.decode for p in probes),
        statistics.fmean(p.prefill for p in probes),
        refs.pop(),
        min(p.at_unix for p in probes),
        sum(p.seconds for p in probes),
    )


def measure_speed(cost, model: str | None = None, threads: int | None = None, repeats: int = 5) -> SpeedProbe:
    """Time ``PROBES`` on a fresh engine for ``cost``'s model and compare with ``cost``."""
    from baton.perf.profile.measure import Grid, StepTimer, engine_for_grid

    t0 = time.monotonic()
    grid = Grid(
        decode=tuple((b, n) for k, b, n in PROBES if k == "decode"),
        ragged=(),
        prefill=tuple((t, c) for k, t, c in PROBES if k == "prefill"),
        mixed=(),
        repeats=repeats,
        max_point_s=3.0,
    )
    engine = engine_for_grid(model or cost.model.spec, grid, cost.threads if threads is None else threads)
    if (
        engine.model_config.num_hidden_layers != cost.model.num_layers
        or engine.model_config.vocab_size != cost.model.vocab_size
    ):
        raise ValueError(
            f"speed probe: the engine's model ({engine.model_dir.name}) is not the cost model's "
            f"({cost.model.name}); pass --model"
        )
    timer = StepTimer(engine, grid.fit_to(engine.max_model_len, repeats + 8))
    timer.prefill(16, 0)  # warm the kernels and the allocator, as the profile does
    timer.decode([64, 64])
    typical = cost.typical_over_fastest
    points = []
    for kind, a, b in PROBES:
        samples = timer.decode([b] * a) if kind == "decode" else timer.prefill(a, b)
        measured = statistics.median(s.seconds for s in samples)
        shape = min(samples, key=lambda s: s.seconds).shape
        points.append(ProbePoint(f"{kind} {a}x{b}", kind, measured, cost.step_seconds(shape) * typical))
    decode, prefill = ratios(points)
    return SpeedProbe(decode, prefill, cost.created, time.time(), time.monotonic() - t0, tuple(points))


def main(argv: list[str] | None = None) -> int:
    from baton.perf.profile.cost_model import CostModel, CostModelError

    p = argparse.ArgumentParser(prog="python -m baton.perf.profile.speed", description=__doc__.split("\n\n")[0])
    p.add_argument("--cost-model", required=True, metavar="FILE", help="the cost model to compare with")
    p.add_argument("--model", default=None, help="the model (default: the cost model's own spec)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: the cost model's)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--json", default=None, metavar="OUT", help="write the probe here")
    args = p.parse_args(argv)
    if args.repeats < 1:
        p.error("--repeats must be >= 1")
    if args.threads is not None and args.threads < 1:
        p.error("--threads must be >= 1")
    try:
        cost = CostModel.load(args.cost_model)
        probe = measure_speed(cost, args.model, args.threads, args.repeats)
    except (CostModelError, ValueError, OSError) as e:
        print(f"speed probe: {e}", file=sys.stderr)
        return 2
    for pt in probe.points:
        print(
            f"  {pt.label:14s} {pt.measured_s * 1e3:8.1f} ms, cost model {pt.predicted_s * 1e3:8.1f} ms "
            f"({pt.measured_s / pt.predicted_s:.2f}x)",
            file=sys.stderr,
        )
    print(
        f"speed: decode steps {probe.decode:.3f}x, prefill steps {probe.prefill:.3f}x the cost model's "
        f"({probe.seconds:.1f} s)",
        file=sys.stderr,
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(probe.to_json(), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
