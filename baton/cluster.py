"""``LocalCluster``: a Ray local cluster with P prefill and D decode workers, and streaming generate.

The driver hosts the rendezvous ``TCPStore`` the workers form their pair groups from, resolves the
model once (so workers never race to import it), starts the actors and the dispatcher.

On CPU each worker is one Ray actor with one CPU and one torch thread; on GPU, one actor per GPU.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace

import ray
from ray.exceptions import GetTimeoutError, RayError

from baton.fleet import FleetOptions, PoolSpec, WorkerFleet
from engine.config import EngineConfig
from engine.errors import ContextLengthError
from engine.model.config import ModelConfig
from engine.model.registry import resolve_model
from engine.model.tokenizer import Tokenizer
from engine.outputs import RequestOutput
from engine.parallel.layout import check_tensor_parallel
from engine.request_spec import RequestSpec
from engine.sampling_params import SamplingParams
from kv_transfer.data_plane import DataPlaneFactory
from router.dispatcher import Dispatcher
from router.stream import RequestStream

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ClusterConfig:
    prefill_workers: int = 1
    decode_workers: int = 1
    engine: EngineConfig = field(default_factory=EngineConfig)
    gpus_per_worker: float = 0.0  # 0 on CPU
    cpus_per_worker: float = 1.0
    torch_threads_per_worker: int = 1  # CPU only
    # The prefill pool's own resources (None: the values above, which are the decode pool's).
    prefill_gpus_per_worker: float | None = None
    prefill_cpus_per_worker: float | None = None
    prefill_torch_threads_per_worker: int | None = None
    local_prefill_threshold: int = 0  # prompts shorter than this skip the prefill pool...
    short_prompts_to_idle_prefill: bool = True  # ...unless a prefill worker has room for them now
    # With a prefill pool: the prompt tokens a decode worker's step may compute (its local prefills
    # ride in its decode steps). None: the engine's whole step budget.
    decode_prefill_token_budget: int | None = 256
    transfer_timeout_s: float = 10.0
    max_restarts: int = 0
    start_timeout_s: float = 300.0
    ray_address: str | None = None  # None: start a local Ray instance
    kv_data_plane: DataPlaneFactory | None = None  # tests: kv_transfer.nccl_double.NcclSemantics(); None: NCCL/gloo
    # Ranks a worker of each pool spans (None: engine.tensor_parallel_size).
    prefill_tensor_parallel_size: int | None = None
    decode_tensor_parallel_size: int | None = None

    def __post_init__(self) -> None:
        if self.prefill_workers < 0 or self.decode_workers < 1:
            raise ValueError("a cluster needs at least one decode worker and a non-negative number of prefill workers")
        if self.transfer_timeout_s <= 0:
            raise ValueError("transfer_timeout_s must be > 0")
        if self.decode_prefill_token_budget is not None and self.decode_prefill_token_budget < 1:
            raise ValueError(
                f"decode_prefill_token_budget must be >= 1 or None, got {self.decode_prefill_token_budget}"
            )


class LocalCluster:
    def __init__(
        self, config: ClusterConfig, progress: Callable[[str], None] | None = None, router_id: str = "router-0"
    ) -> None:
        self.config = config
        say = progress or (lambda m: log.info(m))
        model_dir = resolve_model(config.engine.model, progress=say)
        self.model_dir = model_dir
        engine_cfg = replace(config.engine, model=str(model_dir))
        self.tokenizer = Tokenizer.from_dir(model_dir) if (model_dir / "tokenizer.json").exists() else None
        self._owns_ray = not ray.is_initialized()
        c = config
        tp = c.engine.tensor_parallel_size  # a pool's own size, else this
        pools = {
            "prefill": PoolSpec(
                "prefill",
                c.prefill_workers,
                _or(c.prefill_cpus_per_worker, c.cpus_per_worker),
                _or(c.prefill_gpus_per_worker, c.gpus_per_worker),
                _or(c.prefill_torch_threads_per_worker, c.torch_threads_per_worker),
                tensor_parallel_size=_or(c.prefill_tensor_parallel_size, tp),
            ),
            "decode": PoolSpec(
                "decode",
                c.decode_workers,
                c.cpus_per_worker,
                c.gpus_per_worker,
                c.torch_threads_per_worker,
                tensor_parallel_size=_or(c.decode_tensor_parallel_size, tp),
            ),
        }
        model_cfg = ModelConfig.from_file(model_dir / "config.json")
        for role, spec in pools.items():  # refused here, naming both numbers, before any actor starts
            check_tensor_parallel(
                spec.tensor_parallel_size,
                model_cfg.num_attention_heads,
                model_cfg.num_key_value_heads,
                model_cfg.intermediate_size,
                f"pools.{role}.tensor_parallel_size",
            )
        if self._owns_ray:
            say("starting Ray")
            cpus = sum(p.workers * p.cpus for p in pools.values())  # a worker's cpus: its ranks' total
            ray.init(
                address=config.ray_address,
                num_cpus=None if config.ray_address else max(2, int(cpus) + 1),
                include_dashboard=False,
                log_to_driver=True,
                configure_logging=False,
            )
        say(f"starting {config.prefill_workers} prefill and {config.decode_workers} decode workers")
        self.fleet = WorkerFleet(
            engine_cfg,
            pools["prefill"],
            pools["decode"],
            FleetOptions(
                config.transfer_timeout_s,
                config.max_restarts,
                config.start_timeout_s,
                decode_prefill_token_budget=config.decode_prefill_token_budget,
                kv_data_plane=config.kv_data_plane,
            ),
            say,
        )
        self.pool = self.fleet.start()
        decode = self.pool.decode
        first = decode[0].info
        assert first is not None  # start() returned: every worker reported its info
        self.max_model_len, self.vocab_size = first.max_model_len, first.vocab_size
        self.dispatcher = Dispatcher(
            self.pool,
            router_id=router_id,
            local_prefill_threshold=config.local_prefill_threshold,
            short_prompts_to_idle_prefill=config.short_prompts_to_idle_prefill,
        )
        self.dispatcher.start()
        self._ids = itertools.count()
        say("cluster ready")

    # -- requests -----------------------------------------------------------------------------
    def submit(
        self,
        prompt: str | Sequence[int],
        params: SamplingParams | None = None,
        *,
        request_id: str | None = None,
        priority: int = 0,
        cache_salt: str | None = None,
    ) -> RequestStream:
        params = params or SamplingParams()
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError(f"model {str(self.model_dir)!r} has no tokenizer; text prompts need one")
            ids = self.tokenizer.encode(prompt)
        else:
            ids = list(prompt)
        if not ids:
            raise ValueError("the prompt is empty")
        if len(ids) + params.max_tokens > self.max_model_len:  # as the engine words it (engine/engine.py)
            raise ContextLengthError(
                "max_tokens",
                f"This model's maximum context length is {self.max_model_len} tokens. However, you requested "
                f"{len(ids) + params.max_tokens} tokens ({len(ids)} in the prompt, {params.max_tokens} for the "
                "completion). Please reduce the prompt or max_tokens.",
            )
        rid = request_id or f"req-{next(self._ids)}"
        return self.dispatcher.submit(RequestSpec(rid, tuple(ids), params, priority, cache_salt))

    def stream(self, prompt: str | Sequence[int], params: SamplingParams | None = None) -> Iterator[RequestOutput]:
        yield from self.submit(prompt, params)

    def generate(
        self,
        prompts: Sequence[str | Sequence[int]],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        timeout: float | None = 600.0,
    ) -> list[RequestOutput]:
        if params is None or isinstance(params, SamplingParams):
            params = [params or SamplingParams()] * len(prompts)
        streams = [self.submit(p, sp) for p, sp in zip(prompts, params)]
        return [s.result(timeout) for s in streams]

    def abort(self, request_id: str) -> bool:
        return self.dispatcher.abort(request_id)

    # -- operations ---------------------------------------------------------------------------
    def actor(self, worker_id: str):
        w = self.pool.get(worker_id)
        if w is None:
            raise KeyError(worker_id)
        return w.actor

    def loads(self) -> dict:
        """The current load report of every live worker (dead or unreachable ones are left out)."""
        refs = {w.worker_id: w.actor.load.remote() for w in self.pool.all() if w.alive}
        out = {}
        for wid, ref in refs.items():
            try:
                out[wid] = ray.get(ref, timeout=30)
            except (RayError, GetTimeoutError):
                continue
        return out

    def wait_until_drained(self, timeout: float = 10.0) -> dict:
        """Wait until no worker holds a block (nothing running, reserved or awaiting an ack); return
        the last loads. Raises TimeoutError naming the workers that still hold blocks."""
        deadline = time.monotonic() + timeout
        while True:
            loads = self.loads()
            busy = {
                wid: load
                for wid, load in loads.items()
                if load.num_free_blocks != load.num_total_blocks
                or load.num_running
                or load.num_waiting
                or load.num_reserved
                or load.num_transferring
            }
            if not busy and not self.dispatcher.num_in_flight:
                return loads
            if time.monotonic() > deadline:
                raise TimeoutError(f"workers still hold blocks: {busy}")
            time.sleep(0.1)

    def shutdown(self) -> None:
        self.dispatcher.stop()
        self._kill_actors()
        if self._owns_ray:
            ray.shutdown()

    def _kill_actors(self) -> None:
        self.fleet.kill_all()

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()


def _or(value, default):
    return default if value is None else value
