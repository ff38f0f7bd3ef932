"""The cost model ``baton profile`` writes and the simulator and ``baton plan`` read (pure Python).

File format (JSON, ``"schema": "baton.cost_model/1"``)::

    schema, created, device ("cpu" | "cuda"), threads, machine {...}
    model     {spec, name, architecture, num_layers, vocab_size, max_model_len, dtype,
               kv_bytes_per_token, block_size, num_kv_blocks}
    step      {features [...], coefficients {feature: seconds per unit}, fit {...},
               neighbour_slowdown,                             per busy worker on the same host
               typical_over_fastest}                           a mean repeat / the fastest (noise)
    transfer  {bandwidth_bytes_per_s, latency_s, source}       KV shipped prefill -> decode (gloo)
    local_transfer {...} | null                                the same host, caches in shared memory
    overheads {step_s, rpc_s, output_s, source}                the serving system around a step
    host      {cores, base_cores, cpu_s_per_token, ...} | null the rest of the stack's CPU (baton.perf.profile.host)
    samples   [{kind, seconds, shape {...}}]                   the raw measurements

A step takes ``sum(coefficient x feature)`` seconds (features in ``baton.perf.profile.step_shape``), plus
``overheads.step_s`` when it runs inside a serving worker (its engine loop, output hand-off and
load reports), times ``1 + neighbour_slowdown`` per other worker busy on the same host at the
same time (CPU workers share memory bandwidth and cache); the coefficients fit the fastest repeat of
each batch, and ``typical_over_fastest`` is how much slower the average repeat was (the noise a
serving worker lives with: the simulator multiplies by it). ``rpc_s`` is one router -> worker call;
``output_s`` is a step's outputs reaching the
client (the decode worker's outbox, the router's long poll, the stream).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from baton.perf.profile.fit import FitReport
from baton.perf.profile.host import HostModel
from baton.perf.profile.step_shape import FEATURES, StepShape

SCHEMA = "baton.cost_model/1"


def _transfer(t: dict) -> TransferModel:
    return TransferModel(
        float(t.get("bandwidth_bytes_per_s", TransferModel.bandwidth_bytes_per_s)),
        float(t.get("latency_s", TransferModel.latency_s)),
        str(t.get("source", "default")),
    )


class CostModelError(ValueError):
    """A cost-model file that cannot be used; the message names the file and the field."""


def _finite(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


@dataclass(frozen=True)
class ModelGeometry:
    spec: str  # what --model was given
    name: str
    architecture: str
    num_layers: int
    vocab_size: int
    max_model_len: int
    dtype: str
    kv_bytes_per_token: int  # bytes of K and V over all layers, in the cache dtype
    block_size: int = 16
    num_kv_blocks: int = 0  # a serving worker's pool on this machine (0: unknown)


@dataclass(frozen=True)
class TransferModel:
    bandwidth_bytes_per_s: float = 0.65e9  # gloo over loopback (docs/BENCHMARKS.md)
    latency_s: float = 0.005
    source: str = "default"

    def seconds(self, num_bytes: int) -> float:
        return self.latency_s + num_bytes / self.bandwidth_bytes_per_s


@dataclass(frozen=True)
class Overheads:
    step_s: float = 0.002
    rpc_s: float = 0.002
    output_s: float = 0.002
    source: str = "default"


@dataclass(frozen=True)
class Sample:
    kind: str  # "decode" | "prefill" | "mixed"
    shape: StepShape
    seconds: float
    point: int = 0  # the grid point: repeats of one point share it (the fit takes their fastest)


@dataclass(frozen=True)
class CostModel:
    device: str
    threads: int | None
    model: ModelGeometry
    coefficients: dict[str, float]
    fit: FitReport | None = None
    transfer: TransferModel = TransferModel()
    overheads: Overheads = Overheads()
    machine: dict = field(default_factory=dict)
    samples: tuple[Sample, ...] = ()
    created: str = ""
    neighbour_slowdown: float = 0.0
    local_transfer: TransferModel | None = None  # engine.kv_shared_memory: same-host copies
    host: HostModel | None = None  # None: the workers have the cores to themselves
    typical_over_fastest: float = 1.0

    def __post_init__(self) -> None:
        for name, c in self.coefficients.items():
            if name not in FEATURES:
                raise CostModelError(f"unknown step feature {name!r} (known: {', '.join(FEATURES)})")
            if not (isinstance(c, (int, float)) and math.isfinite(c) and c >= 0):
                raise CostModelError(f"step coefficient {name!r} must be a finite number >= 0, got {c!r}")
        # Finite, or the simulator's clock never passes a NaN time (baton plan hung) or prints NaN.
        for name, t in (("transfer", self.transfer), ("local_transfer", self.local_transfer)):
            if t is not None and not (
                _finite(t.bandwidth_bytes_per_s)
                and t.bandwidth_bytes_per_s > 0
                and _finite(t.latency_s)
                and t.latency_s >= 0
            ):
                raise CostModelError(
                    f"{name}: bandwidth must be a finite number > 0 and latency a finite "
                    f"number >= 0, got {t.bandwidth_bytes_per_s!r} and {t.latency_s!r}"
                )
        o = self.overheads
        for name in ("step_s", "rpc_s", "output_s"):
            v = getattr(o, name)
            if not (_finite(v) and v >= 0):
                raise CostModelError(f"overheads.{name} must be a finite number >= 0, got {v!r}")
        g = self.model
        for name in ("num_layers", "max_model_len", "kv_bytes_per_token", "block_size"):
            if getattr(g, name) <= 0:
                raise CostModelError(f"model.{name} must be > 0, got {getattr(g, name)!r}")
        if g.vocab_size <= 3:  # the workload draws token ids above the special ones
            raise CostModelError(f"model.vocab_size must be > 3, got {g.vocab_size!r}")
        if self.device not in ("cpu", "cuda"):
            raise CostModelError(f"device must be 'cpu' or 'cuda', got {self.device!r}")
        if self.threads is not None and (
            isinstance(self.threads, bool) or not isinstance(self.threads, int) or self.threads < 1
        ):
            raise CostModelError(f"threads must be a positive integer or null, got {self.threads!r}")
        if not (math.isfinite(self.typical_over_fastest) and self.typical_over_fastest >= 1.0):
            raise CostModelError(f"step.typical_over_fastest must be >= 1, got {self.typical_over_fastest!r}")
        if not (math.isfinite(self.neighbour_slowdown) and self.neighbour_slowdown >= 0):
            raise CostModelError(f"step.neighbour_slowdown must be >= 0, got {self.neighbour_slowdown!r}")

    # -- using it ------------------------------------------------------------------------------
    def step_seconds(self, shape: StepShape) -> float:
        """The engine step alone (what ``LLMEngine.step()`` takes for this batch)."""
        if shape.num_tokens == 0:
            return 0.0
        f = shape.features()
        return sum(c * f[n] for n, c in self.coefficients.items())

    def beyond_profile(self, used_max: dict[str, float], slack: float = 1.1) -> dict[str, float]:
        """Of the step features a simulation reached (``used_max``: each one's largest value), those
        past ``slack`` times the largest the profile measured, as used / measured: predictions there
        are extrapolated. Empty without samples (nothing is known of the range)."""
        if not self.samples:
            return {}
        measured: dict[str, float] = {}
        for s in self.samples:
            for name, v in s.shape.features().items():
                measured[name] = max(measured.get(name, 0.0), v)
        return {
            name: round(v / measured[name], 2)
            for name, v in sorted(used_max.items())
            if measured.get(name, 0.0) > 0 and v > slack * measured[name]
        }

    def transfer_seconds(self, num_tokens: int) -> float:
        return self.transfer.seconds(num_tokens * self.model.kv_bytes_per_token)

    def prefill_tokens_per_s(self, chunk: int = 512) -> float:
        """Throughput of a lone prompt prefilled in ``chunk``-token steps (the router's initial rate)."""
        s = self.step_seconds(StepShape(chunk, 1, 1, 0, 0, 0, chunk * chunk))
        return chunk / s if s > 0 else float("inf")

    # -- the file --------------------------------------------------------------------------------
    def to_json(self) -> dict:
        m = self.model
        return {
            "schema": SCHEMA,
            "created": self.created,
            "device": self.device,
            "threads": self.threads,
            "machine": dict(self.machine),
            "model": dict(m.__dict__),
            "step": {
                "features": list(FEATURES),
                "coefficients": dict(self.coefficients),
                "fit": self.fit.to_json() if self.fit else None,
                "neighbour_slowdown": self.neighbour_slowdown,
                "typical_over_fastest": self.typical_over_fastest,
            },
            "transfer": dict(self.transfer.__dict__),
            "local_transfer": dict(self.local_transfer.__dict__) if self.local_transfer else None,
            "overheads": dict(self.overheads.__dict__),
            "host": self.host.to_json() if self.host else None,
            "samples": [
                {"kind": s.kind, "point": s.point, "seconds": s.seconds, "shape": s.shape.to_json()}
                for s in self.samples
            ],
        }

    def save(self, path: str | Path) -> None:
        p = Path(path)
        tmp = p.with_name(p.name + ".tmp")
        try:
            tmp.write_text(json.dumps(self.to_json(), indent=1) + "\n")
            tmp.replace(p)  # a reader never sees half a file
        except BaseException:
            tmp.unlink(missing_ok=True)  # a failed save (p is a directory, a full disk) leaves no stray file
            raise

    @classmethod
    def from_json(cls, d: object, source: str = "cost model") -> CostModel:
        def need(obj: dict, key: str, kind: type | tuple, where: str):
            if not isinstance(obj, dict) or key not in obj:
                raise CostModelError(f"{source}: missing field {where}{key}")
            v = obj[key]
            if not isinstance(v, kind) or (isinstance(v, bool) and kind is not bool):
                raise CostModelError(f"{source}: field {where}{key} has the wrong type ({type(v).__name__})")
            return v

        if not isinstance(d, dict):
            raise CostModelError(f"{source}: not a JSON object")
        schema = d.get("schema")
        if schema != SCHEMA:
            raise CostModelError(f"{source}: schema is {schema!r}, expected {SCHEMA!r} (re-run `baton profile`)")
        num = (int, float)
        m = need(d, "model", dict, "")
        try:
            geometry = ModelGeometry(
                spec=str(m.get("spec", "")),
                name=str(need(m, "name", str, "model.")),
                architecture=str(m.get("architecture", "")),
                num_layers=int(need(m, "num_layers", int, "model.")),
                vocab_size=int(need(m, "vocab_size", int, "model.")),
                max_model_len=int(need(m, "max_model_len", int, "model.")),
                dtype=str(m.get("dtype", "")),
                kv_bytes_per_token=int(need(m, "kv_bytes_per_token", int, "model.")),
                block_size=int(m.get("block_size", 16)),
                num_kv_blocks=int(m.get("num_kv_blocks", 0)),
            )
            step = need(d, "step", dict, "")
            coefs = need(step, "coefficients", dict, "step.")
            fit = FitReport.from_json(step["fit"]) if step.get("fit") else None
            transfer = _transfer(d.get("transfer") or {})
            local = _transfer(d["local_transfer"]) if d.get("local_transfer") else None
            o = d.get("overheads") or {}
            overheads = Overheads(
                float(o.get("step_s", Overheads.step_s)),
                float(o.get("rpc_s", Overheads.rpc_s)),
                float(o.get("output_s", Overheads.output_s)),
                str(o.get("source", "default")),
            )
            samples = tuple(
                Sample(str(s["kind"]), StepShape.from_json(s["shape"]), float(s["seconds"]), int(s.get("point", 0)))
                for s in d.get("samples", [])
            )
            for k, v in coefs.items():
                if not isinstance(v, num) or isinstance(v, bool):
                    raise CostModelError(f"{source}: step.coefficients.{k} must be a number, got {v!r}")
            return cls(
                device=str(need(d, "device", str, "")),
                threads=d.get("threads"),
                model=geometry,
                coefficients={str(k): float(v) for k, v in coefs.items()},
                fit=fit,
                transfer=transfer,
                overheads=overheads,
                machine=dict(d.get("machine") or {}),
                samples=samples,
                created=str(d.get("created", "")),
                neighbour_slowdown=float(step.get("neighbour_slowdown", 0.0)),
                local_transfer=local,
                host=HostModel.from_json(d["host"]) if d.get("host") else None,
                typical_over_fastest=float(step.get("typical_over_fastest", 1.0)),
            )
        except CostModelError as e:
            if str(e).startswith(source):
                raise
            raise CostModelError(f"{source}: {e}") from None
        except (KeyError, TypeError, ValueError) as e:
            raise CostModelError(f"{source}: malformed field ({type(e).__name__}: {e})") from None

    @classmethod
    def load(cls, path: str | Path) -> CostModel:
        p = Path(path)
        try:
            text = p.read_text()
        except OSError as e:
            raise CostModelError(f"cannot read cost model {p}: {e.strerror or e}") from None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise CostModelError(f"{p}: not valid JSON ({e.msg} at line {e.lineno})") from None
        return cls.from_json(data, source=str(p))
