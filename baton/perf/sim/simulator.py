"""Wiring: build the simulated workers, router and dispatcher for a ``SimConfig``, replay a list of
requests, and report what happened (``SimResult``)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from baton.perf.loadgen.slo import LaneSLO
from baton.perf.profile.cost_model import CostModel
from baton.perf.sim.clock import EventLoop
from baton.perf.sim.config import SimConfig
from baton.perf.sim.dispatch import SimDispatcher
from baton.perf.sim.polls import DecodePolls
from baton.perf.sim.requests import RequestRecord, SimRequest
from baton.perf.sim.router import SimRouter
from baton.perf.sim.stats import summarize
from baton.perf.sim.transfer import Channels, PrefillHooks
from baton.perf.sim.worker import Host, SimWorker
from engine.lane_shares import LaneCounters
from kv_transfer.peer import PeerInfo, WorkerInfo
from router.lane_pressure import lane_share_configs
from router.worker_pool import WorkerHandle, WorkerPool


@dataclass
class WorkerReport:
    worker_id: str
    role: str
    steps: int
    busy_s: float
    max_step_s: float
    preemptions: int
    prompt_tokens_computed: int
    prefix_hit_tokens: int
    free_blocks: int
    total_blocks: int
    lane_counters: LaneCounters | None = None  # router.lane_priority: decode tokens, preemptions for pace

    @property
    def leaked_blocks(self) -> int:
        return self.total_blocks - self.free_blocks


@dataclass
class SimResult:
    config: SimConfig
    rate: float | None
    duration_s: float
    records: list[RequestRecord]
    workers: list[WorkerReport]
    end_s: float
    events: int
    transfer_bytes: int
    num_local: int
    num_disaggregated: int
    complete: bool  # every request finished or was rejected before the time limit
    summary: dict = field(default_factory=dict)  # {"summary": Stats, "lanes": {lane: Stats}}
    # Step features that went past the profiled range: used / measured (CostModel.beyond_profile).
    extrapolated: dict[str, float] = field(default_factory=dict)

    def extrapolation_note(self) -> str | None:
        if not self.extrapolated:
            return None
        what = ", ".join(f"{name} {ratio:g}x" for name, ratio in self.extrapolated.items())
        return f"note: steps went past the profiled range ({what} the largest measured): extrapolated there"

    def to_json(self, with_requests: bool = True) -> dict:
        cfg = asdict(self.config)
        cfg.pop("lanes", None)
        out = {
            "config": cfg,
            "label": self.config.label(),
            "rate": self.rate,
            "duration_s": self.duration_s,
            "simulated_end_s": self.end_s,
            "events": self.events,
            "complete": self.complete,
            "placements": {"local": self.num_local, "disaggregated": self.num_disaggregated},
            "transfer_bytes": self.transfer_bytes,
            "extrapolated": self.extrapolated,
            "workers": [{**asdict(w), "leaked_blocks": w.leaked_blocks} for w in self.workers],
            **self.summary,
        }
        if with_requests:
            out["requests"] = [r.to_json() for r in self.records]
        return out


class Simulation:
    def __init__(self, cost: CostModel, cfg: SimConfig, seed: int = 0) -> None:
        self.cost = cost
        self.cfg = cfg
        self.seed = seed
        self.loop = EventLoop()
        m = cost.model
        blocks = cfg.num_kv_blocks or m.num_kv_blocks
        if not blocks:
            raise ValueError("the cost model does not say how many KV blocks a worker has: pass num_kv_blocks")
        self.workers: list[SimWorker] = []
        self.host = Host(cost.host)  # baton up: every worker on this one machine
        host = self.host

        shares = lane_share_configs(cfg.lanes.lanes) if cfg.lane_priority else ()  # as baton.config

        def make(role: str, i: int, budget: int) -> WorkerHandle:
            w = SimWorker(
                f"{role}-{i}",
                role,
                self.loop,
                cost,
                max_num_seqs=cfg.max_num_seqs,
                max_num_batched_tokens=budget,
                num_blocks=blocks,
                enable_prefix_caching=cfg.enable_prefix_caching,
                step_scale=cfg.step_scale,
                prefill_step_scale=cfg.prefill_step_scale,
                host=host,
                lane_shares=shares,
                # as baton.fleet: a decode worker beside a prefill pool caps its own prompt work
                prefill_token_budget=(
                    cfg.decode_prefill_token_budget if role == "decode" and cfg.prefill_workers else None
                ),
            )
            self.workers.append(w)
            info = WorkerInfo(
                PeerInfo(w.worker_id, "sim", role),
                blocks,
                m.block_size,
                m.max_model_len,
                m.vocab_size,
                m.name,
                cfg.max_num_seqs,
                budget,
            )
            return WorkerHandle(w.worker_id, role, w, info=info, alive=True)

        prefill = [make("prefill", i, cfg.prefill_max_num_batched_tokens) for i in range(cfg.prefill_workers)]
        decode = [make("decode", i, cfg.decode_max_num_batched_tokens) for i in range(cfg.decode_workers)]
        self.pool = WorkerPool(prefill, decode)
        self.router = SimRouter(self.loop, cfg, cost, self.pool, seed=seed)
        self.channels = Channels(self.loop)
        transfer = cost.local_transfer if cfg.kv_shared_memory and cost.local_transfer else cost.transfer
        self.prefill_hooks = PrefillHooks(self.channels, self._kv_landed, transfer)
        self.dispatcher = SimDispatcher(
            self.loop,
            self.pool,
            self.prefill_hooks,
            threshold=cfg.local_prefill_threshold,
            short_to_idle_prefill=cfg.short_prompts_to_idle_prefill,
            threads=cfg.dispatch_threads,
            on_finished=self.router.on_finished,
        )
        self.polls = DecodePolls(
            self.loop,
            self.pool,
            self.dispatcher.deliver,
            self.router.on_load,
            pressure=self.router.lane_pressure.latest if self.router.lane_pressure else None,
        )
        self.router.dispatcher = self.dispatcher
        for h in prefill:
            h.actor.hooks = self.prefill_hooks
        for h in decode:
            h.actor.hooks = self.polls
            self.polls.start(h.actor)

    def _arrive(self, req: SimRequest) -> None:
        self.host.note_request(self.loop.now)
        self.router.arrive(req)

    def _kv_landed(self, decode: SimWorker, request_id: str, first_token: int) -> None:
        self.polls.kv_arrived(decode, request_id, first_token)

    def run(
        self,
        requests: list[SimRequest],
        *,
        duration_s: float | None = None,
        rate: float | None = None,
        drain_s: float = 300.0,
        slo: LaneSLO | dict[str, LaneSLO] | None = None,
        warmup_s: float = 0.0,
        lanes: list[str] | None = None,
    ) -> SimResult:
        """Replay ``requests``; stop when all are done or ``drain_s`` after the window closes."""
        loop, router = self.loop, self.router
        last = max((r.arrival_s for r in requests), default=0.0)
        # Without a window, the measured window [0, duration) just includes the last arrival.
        duration = duration_s if duration_s is not None else math.nextafter(last, math.inf)
        for r in sorted(requests, key=lambda r: (r.arrival_s, r.index)):
            loop.at(r.arrival_s, self._arrive, r)
        loop.at(0.0, router.housekeeping)
        if self.cfg.prefill_workers:
            loop.at(0.0, router.monitor)
        n = len(requests)

        def all_done() -> bool:
            return len(router.records) == n and router.in_flight == 0

        limit = max(duration, last) + drain_s
        loop.run(until=limit, stop=all_done)
        complete = all_done()
        if complete:  # let the last acknowledgements and releases happen
            loop.run(until=loop.now + 60.0, stop=lambda: all(w.idle for w in self.workers))
        reports = [
            WorkerReport(
                w.worker_id,
                w.role,
                w.steps,
                w.busy_seconds,
                w.max_step_s,
                w.scheduler.num_preemptions,
                w.scheduler.prompt_tokens_computed,
                w.block_manager.num_prefix_hits,
                w.block_manager.num_free_blocks,
                w.block_manager.num_blocks,
                w.scheduler.lane_shares.counters() if w.scheduler.lane_shares else None,
            )
            for w in self.workers
        ]
        records = sorted(router.records, key=lambda r: r.index)
        res = SimResult(
            self.cfg,
            rate,
            duration,
            records,
            reports,
            loop.now,
            loop.events,
            self.channels.bytes_sent,
            self.dispatcher.num_local,
            self.dispatcher.num_disaggregated,
            complete,
        )
        res.summary = summarize(records, duration_s=duration, warmup_s=warmup_s, slo=slo, lanes=lanes, rate=rate)
        used: dict[str, float] = {}
        for w in self.workers:
            for name, v in w.max_features.items():
                used[name] = max(used.get(name, 0.0), v)
        res.extrapolated = self.cost.beyond_profile(used)
        return res


def simulate(cost: CostModel, cfg: SimConfig, requests: list[SimRequest], **kw) -> SimResult:
    return Simulation(cost, cfg, seed=kw.pop("seed", 0)).run(requests, **kw)
