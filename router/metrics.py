"""Prometheus metrics for the whole cluster, scraped from one router's ``/metrics``.

Names follow ``baton_<what>_<unit>`` (``_total`` only on counters); TTFT, ITL and e2e histograms use
vLLM's bucket edges; labels are ``lane``, ``role``, ``worker``, ``model``. Request-level metrics are
observed by the router as requests finish; worker-level ones (KV usage, prefix cache, transfers,
running/waiting) are read from the workers' latest load reports at scrape time, so one scrape
shows every worker. One registry per router (no process-global state).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.metrics_core import Metric

from engine.worker_stats import WorkerLoad

# vLLM's bucket edges (vllm/v1/metrics/loggers.py).
TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
ITL_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
E2E_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
TTFT_STAGES = ("router_queue", "prefill_queue", "prefill_compute", "transfer", "decode_queue")


class RouterMetrics:
    def __init__(
        self,
        model: str,
        loads: Callable[[], Iterable[WorkerLoad]] = lambda: (),
        slos: Mapping[str, tuple[float, float]] | None = None,
        workers: Iterable[tuple[str, str]] = (),
        lane_names: Mapping[int, str] | None = None,
    ) -> None:
        """``slos``: lane -> (TTFT SLO, TPOT SLO) in seconds, for the attainment counters; ``workers``:
        (role, worker id) of the pools, whose reset counters start at zero; ``lane_names``: priority ->
        lane, for the workers' per-lane counters (lanes reach the workers as their priority)."""
        self.model = model
        self.slos = dict(slos or {})
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.ttft = Histogram(
            "baton_time_to_first_token_seconds",
            "Time to first token.",
            ["lane", "model"],
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "baton_inter_token_latency_seconds",
            "Time between consecutive output tokens.",
            ["lane", "model"],
            buckets=ITL_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "baton_e2e_request_latency_seconds",
            "Arrival to last token.",
            ["lane", "model"],
            buckets=E2E_BUCKETS,
            registry=r,
        )
        self.queue = Histogram(
            "baton_request_queue_seconds",
            "Time a request waited in its router lane queue.",
            ["lane", "model"],
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.window = Histogram(
            "baton_batch_window_seconds",
            "Part of the router queue time spent holding for a lane's batch window.",
            ["lane", "model"],
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.tpot = Histogram(
            "baton_time_per_output_token_seconds",
            "Mean time per output token after the first, per finished request.",
            ["lane", "model"],
            buckets=ITL_BUCKETS,
            registry=r,
        )
        self.slo_met = Counter(
            "baton_requests_slo_met_total",
            "Finished requests that met their lane's SLO "
            "(slo=ttft: time to first token; slo=tpot: time per output token); divide by the "
            "TTFT / TPOT histograms' _count for the attainment.",
            ["lane", "slo", "model"],
            registry=r,
        )
        self.worker_resets = Counter(
            "baton_worker_resets_total",
            "Times this router found a worker down or back "
            "as a new incarnation (its in-flight requests and prefix cache lost).",
            ["role", "worker", "model"],
            registry=r,
        )
        for role, worker in workers:
            self.worker_resets.labels(role, worker, model)
        for lane in self.slos:  # present at zero from the start: an attainment of 0/n shows as 0, not as no data
            for slo in ("ttft", "tpot"):
                self.slo_met.labels(lane, slo, model)
        self.ttft_stage = Histogram(
            "baton_ttft_breakdown_seconds",
            "Time to first token, by stage.",
            ["lane", "stage", "model"],
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.rejected = Counter(
            "baton_requests_rejected_total", "Requests refused at admission.", ["lane", "reason", "model"], registry=r
        )
        self.finished = Counter(
            "baton_requests_finished_total",
            "Requests finished, by finish reason.",
            ["lane", "finish_reason", "model"],
            registry=r,
        )
        self.prompt_tokens = Counter(
            "baton_prompt_tokens_total", "Prompt tokens of finished requests.", ["lane", "model"], registry=r
        )
        self.generation_tokens = Counter(
            "baton_generation_tokens_total", "Generated tokens.", ["lane", "model"], registry=r
        )
        self.waiting = Gauge(
            "baton_requests_waiting",
            "Requests waiting, by lane (role=router: in the router's lane queues).",
            ["lane", "role", "model"],
            registry=r,
        )
        self.running = Gauge(
            "baton_requests_running",
            "Requests dispatched to the pools and not finished.",
            ["lane", "role", "model"],
            registry=r,
        )
        r.register(_WorkerCollector(model, loads, dict(lane_names or {})))

    # -- observations --------------------------------------------------------------------------
    def rejection(self, lane: str, reason: str) -> None:
        self.rejected.labels(lane, reason, self.model).inc()

    def request_finished(
        self,
        lane: str,
        finish_reason: str | None,
        prompt_tokens: int,
        generated: int,
        ttft_s: float | None,
        e2e_s: float | None,
    ) -> None:
        """Counters always; latencies only where given (an aborted request's would skew them)."""
        m = self.model
        self.finished.labels(lane, finish_reason or "unknown", m).inc()
        self.prompt_tokens.labels(lane, m).inc(prompt_tokens)
        self.generation_tokens.labels(lane, m).inc(generated)
        if ttft_s is not None:
            self.ttft.labels(lane, m).observe(ttft_s)
        if e2e_s is not None:
            self.e2e.labels(lane, m).observe(e2e_s)
        slo = self.slos.get(lane)
        if ttft_s is not None and slo is not None and ttft_s <= slo[0]:
            self.slo_met.labels(lane, "ttft", m).inc()
        if ttft_s is not None and e2e_s is not None and generated > 1:
            tpot = (e2e_s - ttft_s) / (generated - 1)
            self.tpot.labels(lane, m).observe(tpot)
            if slo is not None and tpot <= slo[1]:
                self.slo_met.labels(lane, "tpot", m).inc()

    def worker_reset(self, role: str, worker: str) -> None:
        """A worker went down or came back as a new incarnation (from a dispatcher thread)."""
        self.worker_resets.labels(role, worker, self.model).inc()

    def token_gaps(self, lane: str, gaps: Iterable[float]) -> None:
        """Inter-token gaps, observed as the tokens reach the client (router_stream.py): all of a long
        request's at its end stalled the event loop for ~9 ms per 16,000 tokens."""
        h = self.itl.labels(lane, self.model)
        for gap in gaps:
            h.observe(gap)

    def queued(self, lane: str, queue_s: float, window_s: float) -> None:
        self.queue.labels(lane, self.model).observe(queue_s)
        if window_s > 0:
            self.window.labels(lane, self.model).observe(window_s)

    def ttft_breakdown(self, lane: str, stages: dict[str, float]) -> None:
        for stage, seconds in stages.items():
            if seconds is not None and seconds >= 0:
                self.ttft_stage.labels(lane, stage, self.model).observe(seconds)

    def set_lane_gauges(self, waiting: dict[str, int], running: dict[str, int]) -> None:
        for lane, n in waiting.items():
            self.waiting.labels(lane, "router", self.model).set(n)
        for lane, n in running.items():
            self.running.labels(lane, "cluster", self.model).set(n)

    def exposition(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class _WorkerCollector:
    """Worker-level metrics from the latest load reports, read at scrape time."""

    def __init__(
        self, model: str, loads: Callable[[], Iterable[WorkerLoad]], lane_names: dict[int, str] | None = None
    ) -> None:
        self.model = model
        self.loads = loads
        self.lane_names = lane_names or {}

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        labels = ["role", "worker", "model"]
        kv = GaugeMetricFamily(
            "baton_kv_cache_usage_ratio", "Fraction of the worker's KV blocks in use.", labels=labels
        )
        run = GaugeMetricFamily("baton_worker_requests_running", "Requests in the worker's batch.", labels=labels)
        wait = GaugeMetricFamily("baton_worker_requests_waiting", "Requests queued in the worker.", labels=labels)
        queued = GaugeMetricFamily(
            "baton_worker_queued_prefill_tokens", "Prompt tokens admitted, not computed yet.", labels=labels
        )
        q = CounterMetricFamily(
            "baton_prefix_cache_queries", "Prompt tokens looked up in the prefix cache.", labels=labels
        )
        h = CounterMetricFamily("baton_prefix_cache_hits", "Prompt tokens found in the prefix cache.", labels=labels)
        tb = CounterMetricFamily(
            "baton_kv_transfer_bytes", "KV bytes shipped (prefill) or received (decode).", labels=labels
        )
        ts = CounterMetricFamily(
            "baton_kv_transfer_seconds",
            "Seconds from reservation to the last KV chunk, summed over completed transfers (decode side).",
            labels=labels,
        )
        tf = CounterMetricFamily(
            "baton_kv_transfer_failures", "Transfers that failed or missed their deadline.", labels=labels
        )
        tc = CounterMetricFamily("baton_kv_transfers", "Transfers completed.", labels=labels)
        steps = CounterMetricFamily("baton_worker_steps", "Engine steps run.", labels=labels)
        busy = CounterMetricFamily(
            "baton_worker_busy_seconds", "Wall-clock seconds spent in engine steps.", labels=labels
        )
        busy_cpu = CounterMetricFamily(
            "baton_worker_busy_cpu_seconds",
            "CPU seconds of the stepping thread in engine steps (below busy seconds when steps wait for a core).",
            labels=labels,
        )
        pre = CounterMetricFamily(
            "baton_worker_preemptions", "Requests preempted (recompute) for KV blocks.", labels=labels
        )
        pre_tok = CounterMetricFamily(
            "baton_worker_preempted_tokens",
            "Computed tokens preemptions threw away (computed again when the request resumes).",
            labels=labels,
        )
        drafts = CounterMetricFamily(
            "baton_spec_draft_tokens", "Drafted tokens computed (speculative decoding).", labels=labels
        )
        kept = CounterMetricFamily(
            "baton_spec_accepted_tokens",
            "Drafted tokens kept: the model sampled the same token there (speculative decoding).",
            labels=labels,
        )
        for load in self.loads():
            lv = [load.role, load.worker_id, self.model]
            kv.add_metric(lv, load.kv_usage)
            run.add_metric(lv, load.num_running)
            wait.add_metric(lv, load.num_waiting)
            queued.add_metric(lv, load.queued_prefill_tokens)
            q.add_metric(lv, load.prefix_queries)
            h.add_metric(lv, load.prefix_hits)
            tb.add_metric(lv, load.transfer_bytes)
            ts.add_metric(lv, load.transfer_seconds)
            tf.add_metric(lv, load.transfers_failed)
            tc.add_metric(lv, load.transfers_completed)
            steps.add_metric(lv, load.steps)
            busy.add_metric(lv, load.busy_seconds)
            busy_cpu.add_metric(lv, load.busy_cpu_seconds)
            pre.add_metric(lv, load.preemptions)
            pre_tok.add_metric(lv, load.preempted_tokens)
            drafts.add_metric(lv, load.draft_tokens)
            kept.add_metric(lv, load.accepted_draft_tokens)
        yield from (kv, run, wait, queued, q, h, tb, ts, tf, tc, steps, busy, busy_cpu, pre, pre_tok, drafts, kept)
        yield from self._lanes()

    def _lanes(self) -> Iterator[Metric]:
        """Per lane (decode workers with lane shares on): decode tokens (their share is the lane's share
        of decode capacity), sequences preempted for a more important lane's pace, and time spent so."""
        labels = ["lane", "worker", "model"]
        tok = CounterMetricFamily(
            "baton_lane_decode_tokens",
            "Sequences in the decode batch summed over steps "
            "(a token each), by lane: the ratio to all lanes' is the lane's share of decode "
            "capacity.",
            labels=labels,
        )
        pre = CounterMetricFamily(
            "baton_lane_pace_preemptions",
            "Running sequences preempted (recompute) for a more important lane's pace, by lane.",
            labels=labels,
        )
        sec = CounterMetricFamily(
            "baton_lane_preempted_seconds",
            "Seconds sequences preempted for pace spent out of the batch, by lane (counted as they resume).",
            labels=labels,
        )
        for load in self.loads():
            c = load.lane_counters
            if c is None:
                continue
            for family, values in ((tok, c.decode_tokens), (pre, c.pace_preemptions), (sec, c.preempted_seconds)):
                for priority, v in values.items():
                    family.add_metric(
                        [self.lane_names.get(priority, f"priority{priority}"), load.worker_id, self.model], v
                    )
        yield from (tok, pre, sec)
