"""A real ``Router`` over Redis with a dispatcher that answers in process (no Ray): for the router's
own logic around requests (ids, idempotency, deadlines, the durable batch lane)."""

from __future__ import annotations

import tempfile
from pathlib import Path

from engine.outputs import RequestOutput
from engine.request import FinishReason
from engine.request_spec import RequestSpec
from kv_transfer.peer import PeerInfo, WorkerInfo
from router.cluster_state import ClusterState
from router.lanes import LanePolicy, TenantConfig, default_lanes
from router.placement import PlacementHint
from router.router import Router, RouterConfig
from router.state import RedisState
from router.stream import RequestStream
from router.worker_pool import WorkerHandle, WorkerPool


class InProcessDispatcher:
    """Finishes each request with two tokens at once, or holds it while ``hold`` is set."""

    def __init__(self, pool: WorkerPool, router_id: str) -> None:
        self.pool, self.router_id, self.origin = pool, router_id, router_id
        self.local_prefill_threshold = 0
        self.short_prompts_to_idle_prefill = True
        self.on_kv_events = self.on_worker_reset = None
        self.submitted: list[str] = []
        self.specs: dict[str, RequestSpec] = {}  # request id -> the RequestSpec sent
        self.aborted: list[str] = []
        self.hold = False
        self.held: dict[str, RequestStream] = {}

    def submit(self, spec: RequestSpec, stream: RequestStream, hint: PlacementHint) -> None:
        if spec.request_id in self.held:  # as the real dispatcher does
            raise ValueError(f"duplicate request id {spec.request_id!r}")
        self.submitted.append(spec.request_id)
        self.specs[spec.request_id] = spec
        if self.hold:
            self.held[spec.request_id] = stream
        else:
            stream.put(RequestOutput(spec.request_id, [7, 8], "xy", finished=True, finish_reason=FinishReason.LENGTH))

    def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)
        stream = self.held.pop(request_id, None)
        if stream is not None:
            stream.put(RequestOutput(request_id, [], "", finished=True, finish_reason=FinishReason.ABORT))


def make_router(url: str, cluster: str, tenants: tuple[TenantConfig, ...]) -> tuple[Router, InProcessDispatcher]:
    info = WorkerInfo(
        PeerInfo("d0", "inc", "decode"), num_blocks=1000, block_size=16, max_model_len=2048, vocab_size=1000, model="m"
    )
    pool = WorkerPool([], [WorkerHandle("d0", "decode", None, info=info, alive=True)])
    dispatcher = InProcessDispatcher(pool, "router-a")
    config = RouterConfig(
        model_name="m",
        model_dir=Path(tempfile.mkdtemp()),
        slo_rejection=False,
        pace_guard=False,
        lanes=LanePolicy(lanes=default_lanes(), tenants=tenants),
    )
    router = Router(config, pool, dispatcher, ClusterState("router-a", RedisState(url, cluster)))
    router.batch.poll_s = 0.02
    return router, dispatcher


def release(dispatcher: InProcessDispatcher) -> None:
    """Finish every held request with two tokens."""
    for request_id, stream in list(dispatcher.held.items()):
        stream.put(RequestOutput(request_id, [7, 8], "xy", finished=True, finish_reason=FinishReason.LENGTH))
    dispatcher.held.clear()
