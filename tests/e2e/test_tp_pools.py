"""Tensor-parallel pool workers (real Ray, gloo): a worker spans a group of rank actors in its own
placement group. Prefill TP 2 -> decode TP 1, TP 1 -> TP 2 and TP 2 -> TP 2 equal the colocated
TP 1 engine token for token, each prefill rank shipping its own heads; a shared prefix is not
shipped again; a prefill rank killed mid-handoff makes the decode worker prefill itself; a rank of
a decode group killed mid-stream fails its worker, whose requests migrate with no token missing or
repeated, and the group comes back (a later request runs on it). No block is held after each test."""

import os
import signal

import pytest
import ray

from kv_transfer.fault import FaultSpec
from kv_transfer.nccl_double import NcclSemantics
from tests.e2e.helpers import colocated, greedy, nccl_violations, prompts, start_cluster
from tests.waiting import wait_until

VOCAB = 4096
BLOCK = 16


def _cluster(model_dir, prefill_tp, decode_tp, **kw):
    return start_cluster(
        model_dir,
        1,
        1,
        prefill_tensor_parallel_size=prefill_tp,
        decode_tensor_parallel_size=decode_tp,
        # The pair's data plane under NCCL's rules (a group hands its KV off rank to rank instead,
        # kv_transfer/group_handoff.py: it stays idle here).
        kv_data_plane=NcclSemantics(),
        **kw,
    )


@pytest.fixture(scope="module")
def p2d1(ray_session, tiny_model_dir):
    c = _cluster(tiny_model_dir, 2, 1, max_restarts=1)
    yield c
    violations = nccl_violations(c)
    c.shutdown()
    assert violations == []


@pytest.fixture(scope="module")
def p1d2(ray_session, tiny_model_dir):
    c = _cluster(tiny_model_dir, 1, 2, max_restarts=1)
    yield c
    violations = nccl_violations(c)
    c.shutdown()
    assert violations == []


def _rank_pids(cluster, worker_id):
    """The processes of a worker's ranks 1..N-1, as its group reported them (baton/ray_ranks.py)."""
    return ray.get(cluster.actor(worker_id).__ray_call__.remote(lambda w: w.engine.ranks.pids), timeout=30)


def _rank0_sent(cluster):
    """The KV bytes the prefill worker's rank 0 itself shipped (kv_transfer/group_handoff.py)."""
    return ray.get(cluster.actor("prefill-0").__ray_call__.remote(lambda w: w.agent._direct.handoffs.stats.bytes_sent))


def _decode_bytes(cluster):
    return sum(load.transfer_bytes for w, load in cluster.loads().items() if w.startswith("decode"))


@pytest.mark.parametrize("cluster", ["p2d1", "p1d2"])
def test_groups_of_either_size_equal_colocated_tp1(cluster, request, tiny_model_dir):
    c = request.getfixturevalue(cluster)
    ps = prompts(3, 4, VOCAB, lo=40, hi=100)  # several chunks each (a 32-token budget)
    max_new = [12, 6, 10, 8]
    disagg = c.dispatcher.num_disaggregated
    got = [o.token_ids for o in c.generate(ps, [greedy(n) for n in max_new])]
    assert got == colocated(tiny_model_dir, ps, max_new)
    assert c.dispatcher.num_disaggregated == disagg + len(ps)
    loads = c.wait_until_drained()
    assert loads["decode-0"].transfers_failed == 0


def test_groups_of_two_ranks_on_both_sides_hand_off(ray_session, tiny_model_dir):
    c = _cluster(tiny_model_dir, 2, 2)
    try:
        ps = prompts(4, 2, VOCAB, lo=40, hi=80)
        got = [o.token_ids for o in c.generate(ps, [greedy(8), greedy(8)])]
        assert got == colocated(tiny_model_dir, ps, [8, 8])
        assert c.dispatcher.num_disaggregated == len(ps)
        c.wait_until_drained()
        assert nccl_violations(c) == []
    finally:
        c.shutdown()


def test_a_shared_prefix_is_not_shipped_again(p2d1, tiny_model_dir):
    prefix = prompts(5, 1, VOCAB, lo=4 * BLOCK, hi=4 * BLOCK)[0]
    first, second = (prefix + p for p in prompts(6, 2, VOCAB, lo=2 * BLOCK - 5, hi=2 * BLOCK - 5))
    blocks = -(-len(first) // BLOCK)
    b0 = _decode_bytes(p2d1)
    p2d1.generate([first], greedy(4))
    b1, r1 = _decode_bytes(p2d1), _rank0_sent(p2d1)
    out = p2d1.generate([second], greedy(4))[0]
    b2, r2 = _decode_bytes(p2d1), _rank0_sent(p2d1)
    row = (b1 - b0) // blocks
    assert row > 0 and b2 - b1 == row * (blocks - 4)  # the prefix's four blocks stayed on the decode worker
    assert r2 - r1 == (b2 - b1) // 2  # prefill rank 0 shipped its own KV head (of two) only: rank to rank
    assert out.token_ids == colocated(tiny_model_dir, [second], [4])[0]
    p2d1.wait_until_drained()


def test_a_prefill_rank_killed_mid_handoff_falls_back(p2d1, tiny_model_dir):
    """The ranks' heads are out, the header held back: a prefill rank dies, its worker with it; the
    decode worker prefills the prompt itself, and the replaced prefill group hands off again."""
    old = ray.get(p2d1.actor("prefill-0").ping.remote())
    p2d1.actor("prefill-0").set_faults.remote(FaultSpec(delay_s=30.0, delay_next=1))
    p = prompts(16, 1, VOCAB, lo=120, hi=120)[0]  # 4 chunks of 32 tokens
    stream = p2d1.submit(p, greedy(6))
    wait_until(lambda: p2d1.loads()["prefill-0"].num_transferring == 1, timeout_s=30, message="the prompt prefilled")
    [pid] = _rank_pids(p2d1, "prefill-0")
    os.kill(pid, signal.SIGKILL)
    assert stream.result(60).token_ids == colocated(tiny_model_dir, [p], [6])[0]

    def back() -> bool:
        w = p2d1.pool.get("prefill-0")
        return w.alive and w.info.peer.incarnation != old

    wait_until(back, timeout_s=60, interval_s=0.2, message="the prefill group coming back")
    later = prompts(17, 1, VOCAB, lo=40, hi=60)
    disagg = p2d1.dispatcher.num_disaggregated
    assert [o.token_ids for o in p2d1.generate(later, greedy(4))] == colocated(tiny_model_dir, later, [4])
    assert p2d1.dispatcher.num_disaggregated == disagg + 1
    p2d1.wait_until_drained()


def test_a_decode_rank_killed_mid_stream_replaces_its_group(p1d2, tiny_model_dir):
    ps = prompts(14, 2, VOCAB, lo=20, hi=60)
    n = 60
    streams = [p1d2.submit(p, greedy(n)) for p in ps]
    next(iter(streams[0]))
    seen = len(streams[0].token_ids)
    before = ray.get(p1d2.actor("decode-0").ping.remote())
    prefill = ray.get(p1d2.actor("prefill-0").ping.remote())
    [pid] = _rank_pids(p1d2, "decode-0")  # the decode worker's one other rank
    os.kill(pid, signal.SIGKILL)
    outs = [s.result(120) for s in streams]
    assert [o.token_ids for o in outs] == colocated(tiny_model_dir, ps, [n] * 2)  # each token once
    assert seen < n and p1d2.dispatcher.num_migrations >= 1

    def back() -> bool:
        try:
            return ray.get(p1d2.actor("decode-0").ping.remote(), timeout=5) != before
        except ray.exceptions.RayError:
            return False

    wait_until(back, timeout_s=60, interval_s=0.2, message="the decode group coming back")
    later = prompts(15, 1, VOCAB, lo=40, hi=60)
    assert [o.token_ids for o in p1d2.generate(later, greedy(8))] == colocated(tiny_model_dir, later, [8])
    assert ray.get(p1d2.actor("prefill-0").ping.remote()) == prefill  # the other group undisturbed
    [new_pid] = _rank_pids(p1d2, "decode-0")
    assert new_pid != pid  # the new group's rank
    p1d2.wait_until_drained()


@pytest.mark.slow  # (baton up starts Ray and Redis of its own)
def test_baton_up_serves_a_tp2_prefill_pool_like_tp1(tiny_model_dir):
    """``baton up --prefill-tensor-parallel-size 2 --decode-tensor-parallel-size 1``: the OpenAI API
    answers as the colocated TP 1 engine does (a prompt long enough for the prefill pool)."""
    import httpx

    from engine.model.tokenizer import Tokenizer
    from tests.e2e.baton_up_process import baton_up

    prompt = prompts(21, 1, VOCAB, lo=300, hi=300)[0]  # past the default local-prefill threshold
    want = Tokenizer.from_dir(tiny_model_dir).decode(colocated(tiny_model_dir, [prompt], [12])[0])
    args = ("--model", str(tiny_model_dir), "--prefill-tensor-parallel-size", "2", "--decode-tensor-parallel-size", "1")
    with baton_up(*args) as up:
        name = httpx.get(f"{up.base}/v1/models").json()["data"][0]["id"]
        body = {"model": name, "prompt": prompt, "max_tokens": 12, "temperature": 0, "ignore_eos": True}
        r = httpx.post(f"{up.base}/v1/completions", json=body, timeout=120)
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["text"] == want

        def shipped() -> bool:  # the prompt's KV came from the prefill group (reported on the next poll)
            metrics = httpx.get(f"{up.base}/metrics").text
            return any(
                line.startswith("baton_kv_transfers_total")
                and 'worker="decode-0"' in line
                and float(line.split()[-1]) >= 1
                for line in metrics.splitlines()
            )

        wait_until(shipped, timeout_s=30, interval_s=0.5, message="the decode worker's transfer count")
