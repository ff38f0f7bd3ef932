"""The dispatcher's placement when a decode worker dies under the placing call (scripted actors, no
Ray cluster): the request is placed once on another worker, never twice (a second copy on the same
worker was refused as a "duplicate request id" and failed the request)."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

from ray.exceptions import RayError

from engine.request import FinishReason
from engine.request_spec import RequestSpec
from engine.sampling_params import SamplingParams
from router import dispatcher as dispatcher_module
from router.dispatcher import Dispatcher
from router.worker_pool import WorkerHandle, WorkerPool
from tests.waiting import wait_until


class _Method:
    def __init__(self, fn):
        self.fn = fn

    def remote(self, *args):  # runs at once, as a Ray actor call is sent at once; the "ref" gives the outcome
        try:
            result = self.fn(*args)
        except BaseException as e:  # noqa: BLE001 - handed to whoever "gets" the ref
            error = e

            def failed():
                raise error

            return failed
        return lambda: result


class ScriptedDecode:
    """generate_local runs ``during(spec)`` (a death noticed meanwhile), then ``outcome``."""

    def __init__(self, outcome: str = "ok", during=lambda spec: None) -> None:
        self.placed: list[str] = []
        self.aborted: list[str] = []
        self.outcome, self.during = outcome, during
        self.generate_local = _Method(self._generate_local)
        self.abort = _Method(self.aborted.append)

    def _generate_local(self, spec: RequestSpec) -> bool:
        self.during(spec)
        if self.outcome == "dies":
            raise RayError("the actor died")
        if spec.request_id in self.placed:
            raise AssertionError(f"duplicate request id {spec.request_id!r}")
        self.placed.append(spec.request_id)
        return True


class ScriptedDispatcher(Dispatcher):
    def _call(self, ref):
        return ref()


def _handle(worker_id: str, actor) -> WorkerHandle:
    info = SimpleNamespace(num_blocks=100, block_size=16, peer=None)
    return WorkerHandle(worker_id, "decode", actor, info=info, alive=True)


def _spec() -> RequestSpec:
    return RequestSpec("req-1", (1, 2, 3), SamplingParams(max_tokens=4))


def _settle(d: Dispatcher) -> None:
    """Join the migration threads, if any were (wrongly) started: what marks a worker dead starts
    them at once (router/worker_failures.py), and one may start another (hence twice)."""
    for _ in range(2):
        for t in threading.enumerate():
            if t is not threading.current_thread() and t.daemon and t.name.startswith("Thread-"):
                t.join(2)


def _pool_where_decode0_dies_under_the_call(outcome: str):
    pool_box: dict = {}

    def noticed(spec):  # the poller sees decode-0 gone while the placing call is still running
        pool_box["dispatcher"].failures.mark_dead(pool_box["d0"], RayError("poll failed"))

    a0, a1 = ScriptedDecode(outcome, during=noticed), ScriptedDecode()
    d0, d1 = _handle("decode-0", a0), _handle("decode-1", a1)
    d1.requests.add("another request")  # decode-0 is chosen first (it serves fewer)
    pool = WorkerPool([], [d0, d1])
    disp = ScriptedDispatcher(pool, router_id="r")
    pool_box.update(dispatcher=disp, d0=d0)
    return disp, a0, a1


def test_a_worker_dying_under_the_placing_call_is_retried_once_elsewhere():
    disp, a0, a1 = _pool_where_decode0_dies_under_the_call("dies")
    stream = disp.submit(_spec())
    _settle(disp)
    assert a0.placed == [] and a1.placed == ["req-1"] and stream.error is None  # was: placed twice, then failed
    assert disp.placement("req-1")[0] == "decode-1"


def test_a_worker_marked_dead_while_its_call_succeeded_is_left_and_the_request_placed_elsewhere():
    disp, a0, a1 = _pool_where_decode0_dies_under_the_call("ok")
    stream = disp.submit(_spec())
    _settle(disp)
    assert a0.placed == ["req-1"] and a0.aborted == ["req-1"]  # no second copy left running there
    assert a1.placed == ["req-1"] and stream.error is None
    assert disp.placement("req-1")[0] == "decode-1"


def test_requests_a_live_worker_dropped_as_orphans_are_placed_again_after_what_was_delivered():
    from engine.outputs import RequestOutput

    a0, a1 = ScriptedDecode(), ScriptedDecode()
    d0, d1 = _handle("decode-0", a0), _handle("decode-1", a1)
    d1.requests.add("another request")
    disp = ScriptedDispatcher(WorkerPool([], [d0, d1]), router_id="r")
    stream = disp.submit(_spec())
    assert a0.placed == ["req-1"]
    disp._deliver(d0, [RequestOutput("req-1", [7, 8], "ab")])
    a0.placed.remove("req-1")  # decode-0 dropped it as an orphan (our poller had stalled)
    disp.failures.take_back(d0, ["req-1", "unknown"])  # what OutputBatch.dropped says on the router's next poll
    _settle(disp)
    assert disp.num_migrations == 1 and stream.error is None
    assert a0.placed + a1.placed == ["req-1"] and disp.placement("req-1")[0] is not None  # placed anew, once
    tracked = disp._tracked["req-1"]
    assert tracked.spec.resume_token_ids == (7, 8) and tracked.spec.resume_text_chars == 2


def test_a_migration_calls_off_the_prefill_still_shipping_to_the_dead_worker():
    a0, a1, prefill = ScriptedDecode(), ScriptedDecode(), ScriptedDecode()
    d0, d1 = _handle("decode-0", a0), _handle("decode-1", a1)
    p0 = WorkerHandle("prefill-0", "prefill", prefill, info=SimpleNamespace(num_blocks=100, block_size=16), alive=True)
    d1.requests.add("another request")
    disp = ScriptedDispatcher(
        WorkerPool([p0], [d0, d1]), router_id="r", local_prefill_threshold=100, short_prompts_to_idle_prefill=False
    )  # placed on decode-0 alone, for the script
    stream = disp.submit(_spec())
    disp._tracked["req-1"].prefill_id = "prefill-0"  # as _disaggregate leaves it
    disp.failures.mark_dead(d0, RayError("gone"))
    _settle(disp)
    assert prefill.aborted == ["req-1"]  # its blocks were held while it shipped to decode-0's reservation
    assert a1.placed == ["req-1"] and stream.error is None


class ScriptedPrefill:
    def __init__(self) -> None:
        self.forgotten: list = []
        self.forget_peer = _Method(self.forgotten.append)
        self.abort = _Method(lambda rid: None)


def _actor_died(actor_id: str):
    from ray.exceptions import ActorDiedError

    error = ActorDiedError()
    error.actor_id = actor_id
    return error


def test_a_dead_worker_is_announced_to_the_other_pool_once_and_a_slow_one_never():
    """A transfer agent cannot tell a peer that died before their pair formed from one that has not
    dialed yet: it waited for it, holding the chunks queued for it and their staging buffers. The
    router, which sees the death, tells it (forget_peer), alive or only slow itself. A worker that
    only timed out may be slow, and a death reported by a call to an actor since replaced is stale:
    announcing either would cut a live worker off from its pairs for good."""
    from ray.exceptions import GetTimeoutError

    from kv_transfer.peer import PeerInfo

    prefills = [ScriptedPrefill(), ScriptedPrefill()]
    handles = [
        WorkerHandle(f"prefill-{i}", "prefill", a, info=SimpleNamespace(num_blocks=100, block_size=16), alive=True)
        for i, a in enumerate(prefills)
    ]
    handles[1].alive = False  # only slow: a timeout marked it down, and it must hear of the death too
    peer0, peer1 = PeerInfo("decode-0", "inc-a", "decode"), PeerInfo("decode-1", "inc-b", "decode")
    a0, a1 = ScriptedDecode(), ScriptedDecode()
    a0._actor_id, a1._actor_id = SimpleNamespace(hex=lambda: "aa00"), SimpleNamespace(hex=lambda: "bb11")
    d0 = WorkerHandle("decode-0", "decode", a0, info=SimpleNamespace(peer=peer0), alive=True)
    d1 = WorkerHandle("decode-1", "decode", a1, info=SimpleNamespace(peer=peer1), alive=True)
    disp = ScriptedDispatcher(WorkerPool(handles, [d0, d1]), router_id="r")
    disp.failures.mark_dead(d1, GetTimeoutError("slow"))
    disp.failures.mark_dead(d1, _actor_died("cc22"))  # from a call to decode-1's previous actor: stale
    assert all(p.forgotten == [] for p in prefills)
    disp.failures.mark_dead(d0, _actor_died("aa00"))
    disp.failures.mark_dead(d0, _actor_died("aa00"))  # its poller, one interval later
    assert all(p.forgotten == [peer0] for p in prefills)


def test_a_restarted_worker_s_old_incarnation_is_announced_to_the_other_pool():
    from kv_transfer.peer import PeerInfo

    old, new = PeerInfo("prefill-0", "old", "prefill"), PeerInfo("prefill-0", "new", "prefill")
    decode = ScriptedDecode()
    decode.forgotten = []
    decode.forget_peer = _Method(decode.forgotten.append)
    d0 = WorkerHandle("decode-0", "decode", decode, info=SimpleNamespace(peer=None), alive=True)
    prefill = ScriptedPrefill()
    prefill.info = _Method(lambda: SimpleNamespace(peer=new))
    p0 = WorkerHandle("prefill-0", "prefill", prefill, info=SimpleNamespace(peer=old), alive=True)
    disp = ScriptedDispatcher(WorkerPool([p0], [d0]), router_id="r")
    disp.failures.on_restart(p0)
    assert decode.forgotten == [old] and p0.info.peer == new


def test_an_output_that_does_not_continue_the_stream_is_dropped():
    """A copy given up on (its worker was taken for dead) still sent outputs when the request came
    back to that worker: its stale token was appended to the stream (found by a chaos soak)."""
    from engine.outputs import RequestOutput

    a0 = ScriptedDecode()
    d0 = _handle("decode-0", a0)
    disp = ScriptedDispatcher(WorkerPool([], [d0]), router_id="r")
    stream = disp.submit(_spec())
    disp._deliver(d0, [RequestOutput("req-1", [7, 8], "ab", first_index=0)])
    disp._deliver(d0, [RequestOutput("req-1", [5], "c", first_index=1)])  # the stale copy, behind
    disp._deliver(d0, [RequestOutput("req-1", [9], "d", first_index=3)])  # ahead: also not this copy's
    disp._deliver(d0, [RequestOutput("req-1", [4], "e", first_index=2)])
    assert stream.token_ids == [7, 8, 4] and disp.num_stale_outputs == 2


def test_a_request_waits_for_a_decode_worker_that_ray_is_restarting(monkeypatch):
    """Both decode workers killed at once: every request they served failed with "no live decode
    worker", although Ray had them back ~2 s later. A worker that comes back as a new incarnation
    is tried again, even one already tried."""
    from kv_transfer.peer import PeerInfo

    a0 = ScriptedDecode()
    d0 = WorkerHandle(
        "decode-0",
        "decode",
        a0,
        info=SimpleNamespace(num_blocks=100, block_size=16, peer=PeerInfo("decode-0", "old", "decode")),
    )
    disp = ScriptedDispatcher(WorkerPool([], [d0]), router_id="r", placement_wait_s=5.0)
    looked = []  # each time the placement looked for a live decode worker
    real_choose = dispatcher_module.choose_decode
    monkeypatch.setattr(dispatcher_module, "choose_decode", lambda *a: looked.append(1) or real_choose(*a))
    t = threading.Thread(target=disp.submit, args=(_spec(),))
    t.start()
    wait_until(lambda: len(looked) >= 3, message="the placement looking again")  # nothing live: it waits
    assert a0.placed == [] and t.is_alive()
    d0.info = SimpleNamespace(num_blocks=100, block_size=16, peer=PeerInfo("decode-0", "new", "decode"))
    d0.alive = True  # Ray restarted it
    t.join(3)
    assert a0.placed == ["req-1"] and disp._tracked["req-1"].stream.error is None


def test_a_request_with_no_decode_worker_back_in_time_fails():
    a0 = ScriptedDecode()
    d0 = _handle("decode-0", a0)
    d0.alive = False
    disp = ScriptedDispatcher(WorkerPool([], [d0]), router_id="r", placement_wait_s=0.3)
    t0 = time.monotonic()
    stream = disp.submit(_spec())
    assert stream.error == "no live decode worker" and 0.3 <= time.monotonic() - t0 < 5  # (waiting on: 30 s)


class HoldingDecode(ScriptedDecode):
    """A worker that holds each placed request until it is aborted there (as a real one does)."""

    def __init__(self) -> None:
        super().__init__()
        self.abort = _Method(self._abort)

    def _abort(self, request_id: str) -> bool:
        self.aborted.append(request_id)
        if request_id in self.placed:
            self.placed.remove(request_id)
            return True
        return False


def test_a_request_back_on_a_worker_once_taken_for_dead_stops_the_copy_still_there_first():
    """decode-0 only timed out: its copy ran on. When the request came back to it (decode-1 was taken
    for dead in turn), the placement was refused as a duplicate id and the request failed (found by a
    chaos soak). The stale copy is now aborted there before the new placement."""
    from ray.exceptions import GetTimeoutError

    a0, a1 = HoldingDecode(), HoldingDecode()
    d0, d1 = _handle("decode-0", a0), _handle("decode-1", a1)
    d1.requests.add("another request")
    disp = ScriptedDispatcher(WorkerPool([], [d0, d1]), router_id="r", placement_wait_s=2.0)
    stream = disp.submit(_spec())
    assert a0.placed == ["req-1"]
    disp.failures.mark_dead(d0, GetTimeoutError("slow"))  # decode-0 was only slow: its copy still runs
    _settle(disp)
    assert a1.placed == ["req-1"] and a0.placed == ["req-1"]
    d0.alive = True  # it answers again
    disp.failures.mark_dead(d1, GetTimeoutError("slow"))  # and now decode-1 seems dead: back to decode-0
    _settle(disp)
    assert stream.error is None and disp.placement("req-1")[0] == "decode-0"
    assert a0.aborted == ["req-1"] and a0.placed == ["req-1"]  # the stale copy went first, then the new one


def test_a_copy_left_on_a_worker_taken_for_dead_is_stopped_when_the_request_ends():
    """decode-0 only timed out and its copy ran on to the copy's own end, every output dropped. Once
    the request ends elsewhere (finished, failed or aborted by its client) the copy is stopped; not
    before, when the request may still come back to decode-0 (that placement stops it first)."""
    from ray.exceptions import GetTimeoutError

    from engine.outputs import RequestOutput

    for ending in ("finished", "aborted", "failed"):
        a0, a1 = HoldingDecode(), HoldingDecode()
        d0, d1 = _handle("decode-0", a0), _handle("decode-1", a1)
        d1.requests.add("another request")
        disp = ScriptedDispatcher(WorkerPool([], [d0, d1]), router_id="r", placement_wait_s=0.5)
        stream = disp.submit(_spec())
        disp.failures.mark_dead(d0, GetTimeoutError("slow"))  # decode-0 was only slow: its copy still runs
        _settle(disp)
        assert a1.placed == ["req-1"] and a0.aborted == []  # the request lives on decode-1: left alone
        disp._deliver(d0, [RequestOutput("req-1", [5], "x", first_index=0)])  # the stale copy's output
        assert a0.aborted == [] and stream.token_ids == []
        if ending == "finished":
            disp._deliver(
                d1, [RequestOutput("req-1", [7], "a", finished=True, finish_reason=FinishReason.LENGTH, first_index=0)]
            )
            assert stream.token_ids == [7]
        elif ending == "aborted":
            assert disp.abort("req-1")
        else:
            disp.failures.mark_dead(d1, GetTimeoutError("slow"))  # decode-0 still taken for dead: nowhere to go
            _settle(disp)
            wait_until(lambda: stream.error is not None, message="the request failed (its placement wait over)")
        assert a0.aborted == ["req-1"], ending  # the copy on decode-0 stopped, once
        assert disp.num_in_flight == 0
