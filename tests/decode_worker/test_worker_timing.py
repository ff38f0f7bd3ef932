"""A decode worker in this process (no Ray; the rendezvous store is real): the first token's
TTFT breakdown counts the wait for the engine step in flight as queueing."""

from __future__ import annotations

import datetime
import threading
import time

import pytest
import torch.distributed as dist

from decode_worker.worker import DecodeWorker
from engine.config import CacheConfig, EngineConfig
from engine.request_spec import RequestSpec
from engine.sampling_params import SamplingParams
from kv_transfer.peer import StoreAddress
from tests.decode_worker.polling import outputs_until_finished


@pytest.fixture
def worker(tiny_model_dir):
    store = dist.TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=20)
    )
    w = DecodeWorker(
        "decode-t",
        EngineConfig(model=str(tiny_model_dir), cache=CacheConfig(num_blocks=64)),
        StoreAddress("127.0.0.1", store.port),
    )
    yield w
    w.shutdown()


def test_the_wait_for_the_step_in_flight_is_counted_in_prefill_queue(worker: DecodeWorker) -> None:
    # The engine thread is busy for 0.4 s (a long step, as far as a new request can tell).
    busy_since, busy = [], threading.Event()

    def long_step(engine) -> None:
        busy_since.append(time.monotonic())
        busy.set()
        time.sleep(0.4)  # the long step itself

    worker.loop.call_async(long_step)
    assert busy.wait(10)
    sent = time.monotonic()
    spec = RequestSpec("r1", tuple(range(5, 25)), SamplingParams(max_tokens=2, ignore_eos=True), origin="router-a")
    assert worker.generate_local(spec)
    outputs = outputs_until_finished(worker, "router-a")
    first = next(o for o in outputs if o.ttft_breakdown is not None)
    stages = first.ttft_breakdown
    assert stages is not None
    # was ~0: the clock started when the engine thread took it. The step had 0.4 s - (sent - its
    # start) left when the request came (a loaded host may stall this thread before it sends).
    assert stages["prefill_queue"] >= 0.4 - (sent - busy_since[0]) - 0.05
    assert stages["prefill_queue"] + stages["prefill_compute"] <= time.monotonic() - sent
    assert any(o.finished for o in outputs)


def test_a_reservation_naming_a_gone_prefill_worker_prefills_here_and_leaves_no_transfer(worker: DecodeWorker) -> None:
    """The agent failed the transfer inside expect() (clearing the request's transfer id), then the
    reservation recorded it: an entry per such request, never removed."""
    from kv_transfer.peer import PeerInfo

    gone = PeerInfo("prefill-0", "dead", "prefill")
    worker.agent._gone.add(gone.key)  # as a failed channel with that incarnation leaves it
    spec = RequestSpec("g1", tuple(range(5, 60)), SamplingParams(max_tokens=2, ignore_eos=True), origin="router-a")
    assert worker.reserve(spec, gone).accepted
    outputs = outputs_until_finished(worker, "router-a")
    assert any(o.finished for o in outputs) and worker.num_fallbacks == 1
    assert worker._transfer_of == {}
