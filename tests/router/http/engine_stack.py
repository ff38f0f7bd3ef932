"""A real ``Router`` in front of a real engine, in one process without Ray: the tiny model (its
tokenizer and chat template in the router, its weights in an ``LLMEngine`` stepping on a thread)
behind the router's dispatcher interface. For tests of the frontends against everything the router
and the engine check and produce (the fuzzers), where starting Ray workers would cost more than the
test itself. The whole-cluster path is tests/e2e's."""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass
from pathlib import Path

from engine.config import CacheConfig, EngineConfig, SchedulerConfig
from engine.engine import LLMEngine
from engine.outputs import RequestOutput
from engine.request import FinishReason
from engine.request_spec import RequestSpec
from kv_transfer.peer import PeerInfo, WorkerInfo
from router.lanes import LanePolicy, default_lanes
from router.router import Router, RouterConfig
from router.stream import RequestStream
from router.worker_pool import WorkerHandle, WorkerPool

MAX_MODEL_LEN = 128  # short: a fuzzer's long max_tokens then costs little
MODEL_NAME = "tiny"


@dataclass(frozen=True)
class _Add:
    spec: RequestSpec
    stream: RequestStream


class EngineDispatcher:
    """One decode worker, colocated: each request is prefilled and decoded by the engine, whose
    outputs go to the request's stream as the real decode worker's do. A request the engine refuses
    fails its stream, as the real dispatcher fails a request a worker refused."""

    def __init__(self, pool: WorkerPool, engine: LLMEngine) -> None:
        self.pool, self.router_id, self.origin = pool, "router-e", "router-e"
        self.local_prefill_threshold = 0
        self.short_prompts_to_idle_prefill = True
        self.on_kv_events = self.on_worker_reset = None
        self.engine = engine
        self._inbox: queue.SimpleQueue[_Add | str] = queue.SimpleQueue()
        self._streams: dict[str, RequestStream] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="engine-dispatcher", daemon=True)
        self._thread.start()

    def submit(self, spec: RequestSpec, stream: RequestStream, hint: object) -> None:
        self._inbox.put(_Add(spec, stream))

    def abort(self, request_id: str) -> None:
        self._inbox.put(request_id)

    def placement(self, request_id: str) -> tuple[str | None, str | None]:
        return "d0", None

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def _take(self, item: _Add | str) -> None:
        if isinstance(item, str):  # an abort: as the real dispatcher, the stream ends at once
            stream = self._streams.pop(item, None)
            self.engine.abort(item)
            if stream is not None:
                stream.put(RequestOutput(item, [], "", finished=True, finish_reason=FinishReason.ABORT))
            return
        spec = item.spec
        try:
            self.engine.add_request(
                spec.request_id,
                list(spec.prompt_token_ids),
                spec.sampling_params,
                priority=spec.priority,
                cache_salt=spec.cache_salt,
                preemptible=spec.preemptible,
            )
        except Exception as e:  # noqa: BLE001 - the worker refused it: the request fails, as in the cluster
            item.stream.fail(f"d0 refused the request: {e}")
            return
        self._streams[spec.request_id] = item.stream

    def _deliver(self, outputs: list[RequestOutput]) -> None:
        for out in outputs:
            stream = self._streams.get(out.request_id)
            if stream is not None:
                stream.put(out)
                if out.finished:
                    del self._streams[out.request_id]

    def _run(self) -> None:
        while not self._stop.is_set():
            busy = self.engine.has_unfinished_requests()
            try:  # every queued call is taken before the next step; idle, wait for one
                self._take(self._inbox.get_nowait() if busy else self._inbox.get(timeout=0.05))
                continue
            except queue.Empty:
                pass
            if busy:
                try:
                    outputs = self.engine.step()
                except Exception as e:  # noqa: BLE001 - the worker failed: its requests fail (a 5xx seen)
                    for stream in self._streams.values():
                        stream.fail(f"d0 failed: {e!r}")
                    self._streams.clear()
                    continue
                self._deliver(outputs)


def make_engine_router(model_dir: Path) -> tuple[Router, EngineDispatcher]:
    """The router (not started) and its dispatcher over the model in ``model_dir``."""
    engine = LLMEngine(
        EngineConfig(
            model=str(model_dir),
            device="cpu",
            max_model_len=MAX_MODEL_LEN,
            scheduler=SchedulerConfig(max_num_batched_tokens=256),
            cache=CacheConfig(block_size=16, num_blocks=256),
        )
    )
    info = WorkerInfo(
        PeerInfo("d0", "inc", "decode"),
        num_blocks=256,
        block_size=16,
        max_model_len=MAX_MODEL_LEN,
        vocab_size=engine.model_config.vocab_size,
        model=MODEL_NAME,
    )
    pool = WorkerPool([], [WorkerHandle("d0", "decode", None, info=info, alive=True)])
    dispatcher = EngineDispatcher(pool, engine)
    config = RouterConfig(
        model_name=MODEL_NAME,
        model_dir=model_dir,
        slo_rejection=False,
        pace_guard=False,
        lanes=LanePolicy(lanes=default_lanes()),
    )
    return Router(config, pool, dispatcher), dispatcher  # type: ignore[arg-type]  # (the engine, without Ray)
