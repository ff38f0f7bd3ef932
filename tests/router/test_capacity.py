"""Capacity credits in isolation (pure Python): what one dispatch round may take."""

import pytest

from engine.worker_stats import WorkerLoad
from kv_transfer.peer import PeerInfo, WorkerInfo
from router.capacity import Capacity
from router.lane_queues import Room
from router.worker_pool import WorkerHandle, WorkerPool


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _handle(wid: str, role: str, max_num_seqs: int = 8, num_blocks: int = 1000) -> WorkerHandle:
    info = WorkerInfo(
        PeerInfo(wid, "i0", role),
        num_blocks=num_blocks,
        block_size=16,
        max_model_len=4096,
        vocab_size=100,
        model="m",
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=256,
    )
    return WorkerHandle(wid, role, actor=None, info=info, alive=True)


def _load(
    h: WorkerHandle, running: int = 0, waiting: int = 0, queued_prefill: int = 0, received: dict[str, int] | None = None
) -> None:
    h.update_load(
        WorkerLoad(
            h.worker_id,
            "i0",
            h.role,
            num_running=running,
            num_waiting=waiting,
            num_free_blocks=h.info.num_blocks,
            num_total_blocks=h.info.num_blocks,
            queued_prefill_tokens=queued_prefill,
            prompt_tokens_received=received or {},
        )
    )


def test_a_burst_in_one_round_takes_no_more_than_the_free_slots():
    decode = _handle("d0", "decode", max_num_seqs=8)
    _load(decode)
    cap = Capacity(WorkerPool([], [decode]), clock=Clock())
    assert cap.reserve(40, 48, 16)
    _load(decode, running=1)  # the last report: 7 free
    # No report arrives between the checks of one dispatch round: each reservation must count.
    taken = [bool(cap.reserve(40, 48, 16)) for _ in range(24)]
    assert taken.count(True) == 7 and taken[:7] == [True] * 7
    assert cap.free_seq_slots() == 0


def test_own_dispatches_and_reports_are_not_counted_twice():
    decode = _handle("d0", "decode", max_num_seqs=8)
    _load(decode)
    cap = Capacity(WorkerPool([], [decode]), clock=Clock())
    for _ in range(3):
        assert cap.reserve(40, 48, 16)
    _load(decode, running=3)  # the report now includes them
    assert cap.free_seq_slots() == 5
    _load(decode, running=6)  # another router's requests too: the report is the larger
    assert cap.free_seq_slots() == 2
    for _ in range(3):
        cap.release()
    _load(decode, running=3)
    assert cap.free_seq_slots() == 5
    _load(decode, running=8, waiting=2)  # requests waiting in the worker for a slot: negative
    assert cap.free_seq_slots() == -2 and not cap.has_room(40, 48)


def test_prefill_backlog_counts_placed_tokens_until_the_next_report():
    clock = Clock()
    prefill, decode = _handle("p0", "prefill"), _handle("d0", "decode", max_num_seqs=64)
    _load(prefill), _load(decode)
    cap = Capacity(WorkerPool([prefill], [decode]), clock=clock)  # backlog limit: 2 x 256 tokens
    assert cap.reserve(200, 16, 16) and cap.reserve(200, 16, 16)
    assert not cap.has_room(200, 16)  # 400 charged + 200 > 512
    clock.t += 1.0  # charges expired, but the dispatcher placed them: counted on the handle
    prefill.count_dispatched("r", 400)
    assert not cap.has_room(200, 16)
    _load(prefill, queued_prefill=0)  # a report from before they arrived: still on the way
    assert prefill.dispatched_tokens == 400 and not cap.has_room(200, 16)
    _load(prefill, queued_prefill=0, received={"r": 400})  # the report after they were computed: room again
    assert prefill.dispatched_tokens == 0 and cap.has_room(200, 16)


def test_a_short_prompt_does_not_wait_for_the_prefill_backlog():
    prefill, decode = _handle("p0", "prefill"), _handle("d0", "decode", max_num_seqs=64)
    _load(prefill, queued_prefill=2000), _load(decode)  # far past the 2 x 256-token backlog limit
    cap = Capacity(WorkerPool([prefill], [decode]), local_prefill_threshold=256, clock=Clock())
    assert cap.reserve(1700, 16, 16) is Room.PREFILL_FULL  # needs the prefill pool: waits
    assert cap.reserve(40, 16, 16) is Room.YES  # prefills on the decode worker
    assert cap.in_flight == 1
    # Not charged to the prefill backlog: once the pool drains, a long prompt is not held by it.
    _load(prefill, queued_prefill=0)
    assert cap.reserve(500, 16, 16) is Room.YES
    # A full decode pool refuses short and long prompts alike.
    _load(decode, running=64)
    assert cap.reserve(40, 16, 16) is Room.NO and cap.reserve(1700, 16, 16) is Room.NO


def test_a_prompt_past_the_reserve_goes_when_the_decode_pool_is_empty():
    """973 of an idle worker's 1,000 blocks: within its cache but not its 5% reserve. It got NO for
    ever, and as its lane's head it stalled the lane (and every round that reached it)."""
    decode = _handle("d0", "decode", num_blocks=1000)
    _load(decode)
    cap = Capacity(WorkerPool([], [decode]), clock=Clock())
    assert cap.reserve(15500, 16, 16) is Room.YES
    assert cap.room(15500, 16) is Room.NO  # not beside another request: the reserve holds again
    cap.release()
    _load(decode, running=1)  # someone else's request runs there
    assert cap.room(15500, 16) is Room.NO


def test_free_places_are_the_slots_or_what_the_free_kv_holds_if_fewer():
    """With a 65-block pool the blocks, not the 64 slots, bound how many run: admission's wait for a
    place read the slots alone and admitted requests that then waited seconds for blocks."""
    decode = _handle("d0", "decode", max_num_seqs=64, num_blocks=65)
    decode.update_load(
        WorkerLoad(
            "d0",
            "i0",
            "decode",
            num_running=3,
            num_waiting=0,
            num_free_blocks=20,
            num_total_blocks=65,
            queued_prefill_tokens=0,
        )
    )
    cap = Capacity(WorkerPool([], [decode]), clock=Clock())
    assert cap.free_seq_slots() == 61
    assert cap.free_places(40, 200) == (20 - 3) // 7  # 7 blocks a request (40 + 64 tokens), 3 held in reserve
    assert cap.free_places(2000, 16) == 0
    decode.update_load(
        WorkerLoad(
            "d0",
            "i0",
            "decode",
            num_running=0,
            num_waiting=0,
            num_free_blocks=65,
            num_total_blocks=65,
            queued_prefill_tokens=0,
        )
    )
    assert cap.free_places(2000, 16) == 1  # past the reserve, but an empty pool takes a lone request now
    big = _handle("d1", "decode", max_num_seqs=4, num_blocks=100_000)
    _load(big)
    assert Capacity(WorkerPool([], [big]), clock=Clock()).free_places(40, 200) == 4  # the slots, where fewer


def test_the_prefill_backlog_is_kept_to_what_the_pool_computes_within_its_share_of_the_transfer_deadline():
    """On a slow host two step budgets of queued prompts took past the decode workers' transfer
    deadline: the prompt behind them was taken for a stalled transfer and computed twice."""
    prefill, decode = _handle("p0", "prefill"), _handle("d0", "decode", max_num_seqs=64)
    _load(prefill, queued_prefill=100), _load(decode)
    rates: list[list[str]] = []

    def rate(workers: list[str]) -> float:
        rates.append(workers)
        return 40.0  # tokens/s over these prefill workers

    slow = Capacity(WorkerPool([prefill], [decode]), prefill_backlog_s=5.0, prefill_rate=rate, clock=Clock())
    assert slow.prefill_backlog_limit([prefill]) == 200.0  # 5 s x 40 tokens/s, under 2 x 256
    assert slow.reserve(100, 16, 16) is Room.YES  # 100 queued + 100
    assert slow.reserve(10, 16, 16) is Room.PREFILL_FULL
    assert rates[-1] == ["p0"]
    fast = Capacity(WorkerPool([prefill], [decode]), prefill_backlog_s=5.0, prefill_rate=lambda w: 1e6, clock=Clock())
    assert fast.prefill_backlog_limit([prefill]) == 512  # the step budgets bound it
    for bad in (0.0, -1.0):
        with pytest.raises(ValueError, match="prefill_backlog_s"):
            Capacity(WorkerPool([prefill], [decode]), prefill_backlog_s=bad, prefill_rate=rate)
    with pytest.raises(ValueError, match="prefill_backlog_s"):
        Capacity(WorkerPool([prefill], [decode]), prefill_backlog_s=5.0)
