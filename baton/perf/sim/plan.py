"""``baton plan``'s search: simulate every pool layout and token budget up to a worker count, and
pick the cheapest that meets the SLO.

A configuration meets the SLO when at least ``target`` (90%) of the requests sent finish with TTFT
and TPOT within the objectives (rejected and unfinished requests count as misses). The router's
lanes are given the same objectives, so its admission control aims at them too. Cheapest means
fewest workers; ties go to the higher predicted goodput (requests/s within the SLO). The best
colocated configuration (no prefill pool) is reported beside it: the cheapest colocated one that
meets the SLO, or, when none does, the colocated one closest to it.

The search runs in order of worker count and stops adding disaggregated layouts after the first
count where something meets the SLO (a bigger one cannot be cheaper); colocated layouts continue
until one meets it or the count runs out.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from baton.perf.loadgen.slo import LaneSLO
from baton.perf.profile.cost_model import CostModel
from baton.perf.sim.config import SimConfig
from baton.perf.sim.requests import SimRequest
from baton.perf.sim.simulator import Simulation
from router.lanes import LanePolicy

CPU_BUDGETS = (512, 2048)  # token budgets tried (prefill chunk size; decode step budget)
GPU_BUDGETS = (2048, 8192)


@dataclass(frozen=True)
class PlanSpace:
    max_workers: int = 4
    prefill_chunks: tuple[int, ...] = CPU_BUDGETS
    decode_budgets: tuple[int, ...] = CPU_BUDGETS

    def __post_init__(self) -> None:
        if self.max_workers < 1:
            raise ValueError(f"--max-workers must be >= 1, got {self.max_workers}")
        if not self.prefill_chunks or not self.decode_budgets:
            raise ValueError("the budgets to try must not be empty")
        if any(b < 1 for b in self.prefill_chunks + self.decode_budgets):
            raise ValueError("token budgets must be >= 1")

    def configs(self, base: SimConfig, workers: int) -> list[SimConfig]:
        out = []
        for p in range(workers):
            d = workers - p
            chunks = self.prefill_chunks if p else (base.prefill_max_num_batched_tokens,)
            for chunk in chunks:
                for budget in self.decode_budgets:
                    out.append(
                        replace(
                            base,
                            prefill_workers=p,
                            decode_workers=d,
                            prefill_max_num_batched_tokens=chunk,
                            decode_max_num_batched_tokens=budget,
                        )
                    )
        return out


@dataclass(frozen=True)
class Evaluated:
    config: SimConfig
    attainment: float
    goodput_rps: float
    meets: bool
    summary: dict  # the load generator's Stats of all requests
    wall_s: float
    extrapolation: str | None = None  # SimResult.extrapolation_note

    def key(self) -> tuple:
        """Smaller is better: fewest workers, then most goodput, then best attainment."""
        return (self.config.num_workers, -self.goodput_rps, -self.attainment, self.config.prefill_workers)


def _closeness(e: Evaluated) -> tuple:
    """Nearest to meeting the SLO: most requests within it, then most goodput, then lowest p90 TTFT."""
    p90 = e.summary["ttft_s"].get("p90")
    return (e.attainment, e.goodput_rps, -(p90 if p90 is not None else float("inf")))


@dataclass(frozen=True)
class PlanResult:
    best: Evaluated | None
    best_colocated: Evaluated | None
    evaluated: list[Evaluated]
    wall_s: float

    @property
    def best_disaggregated(self) -> Evaluated | None:
        """The best layout with a prefill pool among those simulated (meeting the SLO first)."""
        dis = [e for e in self.evaluated if not e.config.colocated]
        met = [e for e in dis if e.meets]
        return min(met, key=Evaluated.key) if met else max(dis, key=_closeness, default=None)


def with_slo(policy: LanePolicy, slo: LaneSLO) -> LanePolicy:
    """The router's lanes with the planned objectives, so that its SLO-predictive admission aims at
    the same target the plan is scored on (a 2 s interactive lane would turn away every prompt that
    takes longer than that to prefill, whatever the plan allows)."""
    lanes = tuple(replace(lane, ttft_slo_s=slo.ttft_s, tpot_slo_s=slo.tpot_s) for lane in policy.lanes)
    return replace(policy, lanes=lanes)


def evaluate(
    cost: CostModel,
    cfg: SimConfig,
    requests: list[SimRequest],
    *,
    duration_s: float,
    slo: LaneSLO,
    target: float,
    seed: int,
    lanes: list[str],
) -> Evaluated:
    t0 = time.perf_counter()
    res = Simulation(cost, cfg, seed=seed).run(
        requests,
        duration_s=duration_s,
        drain_s=duration_s,
        slo=slo,
        lanes=lanes,
        rate=len(requests) / duration_s if duration_s else None,
    )
    s = res.summary["summary"]
    att = s["slo_attainment"] or 0.0
    return Evaluated(
        cfg, att, s["goodput_rps"] or 0.0, att >= target, s, time.perf_counter() - t0, res.extrapolation_note()
    )


def search(
    cost: CostModel,
    requests: list[SimRequest],
    *,
    base: SimConfig,
    space: PlanSpace,
    slo: LaneSLO,
    duration_s: float,
    target: float = 0.9,
    seed: int = 0,
    lanes: list[str] | None = None,
    progress: Callable[[Evaluated], None] = lambda e: None,
) -> PlanResult:
    if not 0 < target <= 1:
        raise ValueError(f"the SLO target must be in (0, 1], got {target}")
    base = replace(base, lanes=with_slo(base.lanes, slo))
    t0 = time.perf_counter()
    lanes = lanes or sorted({r.lane for r in requests})
    evaluated: list[Evaluated] = []
    best: Evaluated | None = None
    colocated_met = False
    for n in range(1, space.max_workers + 1):
        for cfg in space.configs(base, n):
            if best is not None and not cfg.colocated:
                continue  # a disaggregated layout this size cannot beat the one found
            if (
                colocated_met
                and cfg.colocated
                and cfg.num_workers > min(e.config.num_workers for e in evaluated if e.config.colocated and e.meets)
            ):
                continue
            e = evaluate(cost, cfg, requests, duration_s=duration_s, slo=slo, target=target, seed=seed, lanes=lanes)
            evaluated.append(e)
            progress(e)
            colocated_met |= cfg.colocated and e.meets
        met = [e for e in evaluated if e.meets]
        if met and best is None:
            best = min(met, key=Evaluated.key)
        if best is not None and colocated_met:
            break
    met = [e for e in evaluated if e.meets]
    best = min(met, key=Evaluated.key) if met else None
    colo = [e for e in evaluated if e.config.colocated]
    colo_met = [e for e in colo if e.meets]
    best_colo = min(colo_met, key=Evaluated.key) if colo_met else max(colo, key=_closeness, default=None)
    return PlanResult(best, best_colo, evaluated, time.perf_counter() - t0)
