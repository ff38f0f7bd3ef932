"""The direct KV handoff between two groups (engine/parallel/direct_kv.py): every decode rank ends
up with the heads a one-rank engine computed, each prefill rank ships only the heads it is the
source of (rank 0 gathers nothing of the others'), for groups of either size and with a KV head
replicated on the decode side (2 KV heads over 4 ranks); a receive whose source sends nothing, or
dies, fails in bounded time instead of hanging."""

import threading
import time

import pytest
import torch

from engine.parallel.direct_kv import HandoffClose, HandoffJoin, HandoffRecv, HandoffSend, RankHandoffs, run_handoff
from engine.parallel.group import host_store
from engine.parallel.head_routes import handoff_routes
from engine.request import RequestState
from engine.sampling_params import SamplingParams
from tests.engine.parallel.conftest import group_engine

BLOCK = 4


def _handoffs(engine):
    return RankHandoffs(
        0, engine.config.tensor_parallel_size, engine.runner.kv_cache, engine.model_config.num_key_value_heads
    )


def _join(store, pairs, p, d, key="k"):
    """Both workers' ranks form the pair's group (each rank on a thread of its own)."""
    threads = [
        threading.Thread(
            target=run_handoff,
            args=(e.ranks, h, HandoffJoin(key, "127.0.0.1", store.port, f"pair/{key}", role, p, d, 30.0)),
        )
        for role, (e, h) in zip(("prefill", "decode"), pairs)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert all(h.wait_formed(key, 60) for _, h in pairs)


@pytest.mark.parametrize(("p", "d"), [(2, 1), (1, 4)])  # (1 -> 2, 2 -> 2: tests/e2e/test_tp_pools.py)
def test_each_rank_ships_its_own_heads_to_the_ranks_holding_them(tiny, p, d):
    prompt = list(range(7, 7 + 22))
    store = host_store()
    one = group_engine(tiny, 1)
    pre, dec = group_engine(tiny, p), group_engine(tiny, d)
    try:
        ph, dh = _handoffs(pre), _handoffs(dec)
        want = one.export_kv(_prefilled(one, prompt))
        src = _prefilled(pre, prompt)
        # Planned before the pair formed: the ranks hold the send until it has.
        run_handoff(pre.ranks, ph, HandoffSend("k", tuple(src), p, d))
        _join(store, [(pre, ph), (dec, dh)], p, d)
        dst = [20, 21, 22, 23, 24]
        failed, received = run_handoff(dec.ranks, dh, HandoffRecv("k", len(dst), tuple(dst), 30.0))
        assert failed == 0
        got = dec.export_kv(dst)  # (the interim gather: every head, to compare)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)

        row = want[0].numel() * want.element_size()
        heads = pre.model_config.num_key_value_heads
        routes = handoff_routes(heads, p, d)
        shipped = sum(r.end_head - r.first_head for r in routes)  # a replicated head goes to each holder
        assert received == len(dst) * row * shipped // heads
        mine = sum(r.end_head - r.first_head for r in routes if r.src == 0)
        assert ph.stats.bytes_sent == len(dst) * row * mine // heads  # rank 0 ships its heads only
        if p > 1:
            assert mine < shipped
        run_handoff(pre.ranks, ph, HandoffClose("k"))
        run_handoff(dec.ranks, dh, HandoffClose("k"))
        assert ph.pairs == dh.pairs == 0
    finally:
        pre.close()
        dec.close()


def test_a_receive_fails_in_bounded_time_when_its_source_sends_nothing_or_dies(tiny):
    store = host_store()
    pre, dec = group_engine(tiny, 2), group_engine(tiny, 1)
    try:
        ph, dh = _handoffs(pre), _handoffs(dec)
        _join(store, [(pre, ph), (dec, dh)], 2, 1)
        # The pair formed but nothing is sent: the receive gives up at its timeout, never hangs,
        # and the pair carries nothing more.
        assert run_handoff(dec.ranks, dh, HandoffRecv("k", 2, (3, 4), 0.5))[0] == 1
        assert not dh.has("k")

        _join(store, [(pre, ph), (dec, dh)], 2, 1, key="k2")
        ph.apply(HandoffSend("k2", (1, 2), 2, 1))  # rank 0's head goes out; rank 1 dies before it sends its own
        rank1 = pre.ranks.processes[0]
        rank1.kill()
        rank1.join(10)
        start = time.monotonic()
        failed, _ = run_handoff(dec.ranks, dh, HandoffRecv("k2", 2, (3, 4), 60.0))
        assert failed == 1 and time.monotonic() - start < 30  # the dead rank's connection ended it
        assert not dh.has("k2")
    finally:
        pre.close()
        dec.close()


def _prefilled(engine, prompt):
    rid = engine.add_request(None, prompt, SamplingParams(max_tokens=1, detokenize=False), prefill_only=True)
    while engine.scheduler.requests[rid].state is not RequestState.TRANSFERRING:
        engine.step()
    return engine.scheduler.requests[rid].block_ids[: len(prompt) // BLOCK]
