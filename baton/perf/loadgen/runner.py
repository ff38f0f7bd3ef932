"""One load-generation run: plan -> send (open or closed loop) -> records + time series.

Open loop (``rate``): every planned request is sent at its arrival time whether or not earlier
ones have finished, as real users do; the server's queues, not the client, absorb overload.
Closed loop (``concurrency``): C clients each send their next request when the previous one ends.

After the last arrival the run waits up to ``drain_s`` for requests still in flight; any left are
cancelled (the server aborts them) and recorded as ``timeout``. Only requests planned inside the
measured window ``[warmup_s, duration_s)`` enter the statistics; all are kept in the records.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from baton.perf.loadgen.arrivals import Burst, PlannedRequest, plan_requests, sample_request
from baton.perf.loadgen.outgoing import Client, Outgoing, ServerInfo
from baton.perf.loadgen.progress import Progress
from baton.perf.loadgen.prompts import DEFAULT_TOKEN_RANGE, PromptFactory, clip_prompt_len
from baton.perf.loadgen.records import REQUEST_TIMEOUT, UNFINISHED, RequestRecord
from baton.perf.loadgen.run_checks import check_non_negative, check_positive
from baton.perf.loadgen.server_metrics import MetricsSample, poll
from baton.perf.loadgen.slo import LaneSLO, resolve_slos
from baton.perf.loadgen.stats import LaneStats, summarize, summarize_by_lane
from baton.perf.loadgen.workload import WorkloadSpec


@dataclass(frozen=True)
class RunConfig:
    url: str  # http://host:port, or host:port / grpc://host:port with protocol="grpc"
    spec: WorkloadSpec
    duration_s: float
    rate: float | None = None  # open loop: requests/s
    concurrency: int | None = None  # closed loop: clients
    protocol: Literal["http", "grpc"] = "http"
    metrics_url: str | None = None  # None: <url>/metrics over HTTP, nothing over gRPC
    burst: Burst | None = None
    seed: int = 0
    warmup_s: float = 0.0
    slos: dict[str, LaneSLO] = field(default_factory=dict)  # empty: the lanes' defaults
    timeout_s: float = 600.0  # per request, end to end
    drain_s: float | None = None  # after the last arrival; None: timeout_s
    api_key: str | None = None
    metrics_interval_s: float = 0.5
    progress: bool = True
    salt: int | None = None  # prompt-content salt; None: fresh per run (no cache hits across runs)
    token_range: tuple[int, int] | None = None  # None: from the server's vocab size, else the default

    def __post_init__(self) -> None:
        if (self.rate is None) == (self.concurrency is None):
            raise ValueError("give exactly one of rate (open loop) and concurrency (closed loop)")
        # Finite only: an infinite rate or duration plans requests forever; a negative drain cuts the run short.
        if self.rate is not None:
            check_positive("rate", self.rate)
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")
        check_positive("duration", self.duration_s)
        if self.drain_s is not None:
            check_non_negative("drain", self.drain_s)
        if not 0 < self.timeout_s < math.inf:
            raise ValueError(f"timeout must be a finite number of seconds > 0, got {self.timeout_s}")
        if not 0 <= self.warmup_s < self.duration_s:
            raise ValueError(f"warmup must be in [0, duration), got {self.warmup_s}")
        if self.burst is not None and self.concurrency is not None:
            raise ValueError("a burst needs an open-loop rate, not a concurrency")
        if self.protocol not in ("http", "grpc"):
            raise ValueError(f"protocol must be http or grpc, got {self.protocol!r}")

    @property
    def effective_metrics_url(self) -> str | None:
        if self.metrics_url is not None:
            return self.metrics_url or None  # "" disables
        return f"{self.url.rstrip('/')}/metrics" if self.protocol == "http" else None

    def resolved_slos(self) -> dict[str, LaneSLO]:
        return {**resolve_slos(tuple(self.spec.lanes)), **self.slos}

    def to_dict(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "protocol": self.protocol,
            "metrics_url": self.effective_metrics_url,
            "mode": "open" if self.rate is not None else "closed",
            "rate": self.rate,
            "concurrency": self.concurrency,
            "duration_s": self.duration_s,
            "warmup_s": self.warmup_s,
            "burst": None
            if self.burst is None
            else {"factor": self.burst.factor, "start_s": self.burst.start_s, "length_s": self.burst.length_s},
            "seed": self.seed,
            "timeout_s": self.timeout_s,
            "workload": self.spec.to_dict(),
            "slos": {lane: s.to_dict() for lane, s in sorted(self.resolved_slos().items())},
        }


@dataclass
class RunResult:
    config: RunConfig
    server: ServerInfo
    records: list[RequestRecord]
    timeseries: list[MetricsSample]
    started_at: float  # unix time
    wall_s: float
    clipped_prompts: int = 0  # prompts shortened to fit the model's context

    @property
    def window_s(self) -> float:
        return self.config.duration_s - self.config.warmup_s

    def measured(self) -> list[RequestRecord]:
        w0, w1 = self.config.warmup_s, self.config.duration_s
        return [r for r in self.records if w0 <= r.arrival_s < w1]

    def _offered(self, lane: str | None = None) -> float | None:
        if self.config.rate is None:
            return None
        return self._arrival_rate(lane)

    def _arrival_rate(self, lane: str | None = None) -> float:
        return sum(1 for r in self.measured() if lane is None or r.lane == lane) / self.window_s

    def summary(self) -> LaneStats:
        return summarize(
            self.measured(), self.config.resolved_slos(), self.window_s, self.config.warmup_s, self._offered()
        )

    def lanes(self) -> dict[str, LaneStats]:
        rates = {lane: self._arrival_rate(lane) for lane in self.config.spec.lanes} if self.config.rate else None
        return summarize_by_lane(
            self.measured(), self.config.resolved_slos(), self.window_s, self.config.warmup_s, rates
        )


def make_client(cfg: RunConfig) -> Client:
    if cfg.protocol == "grpc":
        from baton.perf.loadgen.grpc_client import GrpcClient

        return GrpcClient(cfg.url, api_key=cfg.api_key, timeout_s=cfg.timeout_s)
    from baton.perf.loadgen.http_client import HttpClient

    return HttpClient(cfg.url, api_key=cfg.api_key, timeout_s=cfg.timeout_s)


def _token_range(cfg: RunConfig, info: ServerInfo) -> tuple[int, int]:
    if cfg.token_range is not None:
        return cfg.token_range
    if info.vocab_size and info.vocab_size > 512:
        return DEFAULT_TOKEN_RANGE[0], info.vocab_size
    return DEFAULT_TOKEN_RANGE


async def run_load(cfg: RunConfig, client: Client | None = None) -> RunResult:
    own_client = client is None
    client = client or make_client(cfg)
    try:
        return await _run(cfg, client)
    finally:
        if own_client:
            await client.aclose()


async def _run(cfg: RunConfig, client: Client) -> RunResult:
    try:
        info = await client.server_info()
    except Exception as e:  # noqa: BLE001 - any failure here means there is no usable server
        raise RuntimeError(f"cannot reach the server at {cfg.url}: {e}") from None
    low, high = _token_range(cfg, info)
    salt = cfg.salt if cfg.salt is not None else random.SystemRandom().getrandbits(48)
    prompts = PromptFactory(cfg.spec, salt, low, high)
    max_len = info.max_model_len
    clipped = 0

    def outgoing(p: PlannedRequest) -> Outgoing:
        nonlocal clipped
        n = clip_prompt_len(p, max_len)
        clipped += n != p.prompt_len
        return Outgoing(p.index, p.lane, tuple(prompts.token_ids(p, n)), p.output_len, p.arrival_s, cfg.spec.streaming)

    records: list[RequestRecord] = []
    samples: list[MetricsSample] = []
    in_flight: set[asyncio.Task] = set()
    progress = Progress(cfg.duration_s, enabled=cfg.progress)
    # Open loop: every prompt is built before the clock starts, so building one never delays a send.
    plan = (
        []
        if cfg.rate is None
        else [outgoing(p) for p in plan_requests(cfg.spec, cfg.rate, cfg.duration_s, cfg.seed, cfg.burst)]
    )
    t0 = time.perf_counter()
    clock = lambda: time.perf_counter() - t0  # noqa: E731

    async def one(o: Outgoing) -> None:
        sent = clock()
        progress.sent += 1
        try:
            rec = await asyncio.wait_for(client.send(o, clock), timeout=cfg.timeout_s)
        except (TimeoutError, asyncio.CancelledError) as e:  # over time, or cut at the end of the drain
            rec = RequestRecord(
                o.index,
                o.lane,
                len(o.prompt_ids),
                o.max_tokens,
                o.arrival_s,
                sent,
                status="timeout",
                end_s=clock(),
                error_type=UNFINISHED if isinstance(e, asyncio.CancelledError) else REQUEST_TIMEOUT,
            )
        records.append(rec)
        progress.done += 1
        progress.failed += rec.status != "ok"

    def launch(o: Outgoing) -> asyncio.Task:
        task = asyncio.create_task(one(o))
        in_flight.add(task)
        task.add_done_callback(in_flight.discard)
        return task

    started_at = time.time()
    stop = asyncio.Event()
    poller = asyncio.create_task(
        poll(cfg.effective_metrics_url, cfg.metrics_interval_s, clock, lambda: len(in_flight), samples, stop)
    )

    async def ticker() -> None:
        while True:
            progress.update(clock(), len(in_flight))
            await asyncio.sleep(0.25)

    tick = asyncio.create_task(ticker())
    try:
        if cfg.rate is not None:
            for o in plan:
                delay = o.arrival_s - clock()
                if delay > 0:
                    await asyncio.sleep(delay)
                launch(o)
        else:
            rng = random.Random(f"baton-requests:{cfg.seed}")
            counter = iter(range(1 << 62))

            async def closed_client() -> None:
                while clock() < cfg.duration_s:
                    task = launch(outgoing(sample_request(cfg.spec, next(counter), rng, arrival_s=clock())))
                    # At the end of the window the request is left to the drain below, like open-loop ones.
                    await asyncio.wait({task}, timeout=max(0.0, cfg.duration_s - clock()))

            await asyncio.gather(*(closed_client() for _ in range(cfg.concurrency or 1)))
        remaining = max(0.0, cfg.duration_s - clock())
        await asyncio.sleep(remaining)  # the window lasts its full duration even if the plan ends early
        if in_flight:
            drain = cfg.timeout_s if cfg.drain_s is None else cfg.drain_s
            await asyncio.wait(set(in_flight), timeout=drain)
        for task in list(in_flight):
            task.cancel()
        if in_flight:
            await asyncio.gather(*in_flight, return_exceptions=True)
    finally:
        tick.cancel()
        stop.set()
        await asyncio.gather(poller, tick, return_exceptions=True)
        for task in list(in_flight):
            task.cancel()
    progress.close(clock(), len(in_flight))
    records.sort(key=lambda r: r.index)
    return RunResult(cfg, info, records, samples, started_at, clock(), clipped)


def run_load_sync(cfg: RunConfig) -> RunResult:
    return asyncio.run(run_load(cfg))


def with_rate(cfg: RunConfig, rate: float) -> RunConfig:
    return replace(cfg, rate=rate, concurrency=None)
