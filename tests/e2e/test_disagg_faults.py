"""Faults in a live cluster (1 prefill + 2 decode workers, real Ray, gloo): dropped and delayed
transfers fall back to local prefill within deadline + 1 s; a channel severed between live
workers forms again; a prefill worker that dies mid-transfer
and one killed mid-prefill cost nothing but time; a restarted worker rejoins the transfer mesh; a
decode worker killed mid-stream hands its requests to the other with no missing or repeated token.
After each test no worker holds a block."""

import time

import pytest
import ray

from kv_transfer.fault import FaultSpec
from kv_transfer.nccl_double import NcclSemantics
from tests.e2e.helpers import colocated, greedy, nccl_violations, prompts, start_cluster
from tests.waiting import wait_until

VOCAB = 4096
DEADLINE = 2.0


@pytest.fixture(scope="module")
def cluster(ray_session, tiny_model_dir):
    c = start_cluster(
        tiny_model_dir, 1, 2, transfer_timeout_s=DEADLINE, max_restarts=1, kv_data_plane=NcclSemantics()
    )  # the payloads' data plane under NCCL's rules
    yield c
    violations = nccl_violations(c)
    c.shutdown()
    assert violations == []


def _failed_transfers(cluster):
    return sum(load.transfers_failed for w, load in cluster.loads().items() if w.startswith("decode"))


def _first_token_latency(cluster, prompt, n=6):
    t0 = time.monotonic()
    stream = cluster.submit(prompt, greedy(n))
    out = stream.result(60)
    return stream.first_token_time - t0, out


@pytest.mark.parametrize(
    "fault", [FaultSpec(drop_next=1), FaultSpec(delay_s=DEADLINE + 5.0, delay_next=1)], ids=["drop", "delay"]
)
def test_lost_or_late_transfer_falls_back_within_deadline(cluster, tiny_model_dir, fault):
    failed_before = _failed_transfers(cluster)
    cluster.actor("prefill-0").set_faults.remote(fault)
    p = prompts(10, 1, VOCAB, lo=60, hi=60)[0]
    ttft, out = _first_token_latency(cluster, p)
    # The fallback's local prefill comes after the deadline (2.1-2.7 s on a loaded 2-core host);
    # waiting for the late send instead would take past DEADLINE + 5.
    assert ttft < DEADLINE + 2.5
    assert out.token_ids == colocated(tiny_model_dir, [p], [6])[0]
    assert _failed_transfers(cluster) == failed_before + 1
    cluster.wait_until_drained(timeout=DEADLINE + 10)  # a late transfer is refused and the sender frees too


def test_a_channel_severed_between_live_workers_heals(cluster, tiny_model_dir):
    """A send error with both workers alive fails the transfer in flight (it is prefilled locally),
    and the pair forms again: later transfers between the same two workers go through."""

    def decode_counts():
        return {
            w: (load.transfers_completed, load.transfers_failed)
            for w, load in cluster.loads().items()
            if w.startswith("decode")
        }

    before = decode_counts()
    cluster.actor("prefill-0").set_faults.remote(FaultSpec(sever_after_chunks=0))
    p = prompts(15, 1, VOCAB, lo=40, hi=40)[0]
    assert cluster.submit(p, greedy(6)).result(60).token_ids == colocated(tiny_model_dir, [p], [6])[0]
    after = decode_counts()
    severed = [w for w in after if after[w][1] == before[w][1] + 1]
    assert len(severed) == 1 and sum(a[1] for a in after.values()) == sum(b[1] for b in before.values()) + 1
    ps = prompts(16, 8, VOCAB, lo=20, hi=40)
    for q in ps:  # one at a time, until one is placed on the severed pair's decode worker
        assert cluster.submit(q, greedy(4)).result(60).token_ids == colocated(tiny_model_dir, [q], [4])[0]
        now = decode_counts()
        if now[severed[0]][0] > after[severed[0]][0]:
            break
    else:
        pytest.fail(f"no request was placed on {severed[0]} again")
    assert {w: c[1] for w, c in now.items()} == {w: c[1] for w, c in after.items()}  # no other failure
    cluster.wait_until_drained()


def test_prefill_worker_dying_mid_transfer_costs_only_time(cluster, tiny_model_dir):
    p_actor = cluster.actor("prefill-0")
    old = ray.get(p_actor.ping.remote())
    p_actor.set_faults.remote(FaultSpec(die_after_chunks=1))  # crashes after its first chunk
    p = prompts(11, 1, VOCAB, lo=120, hi=120)[0]  # 4 chunks of 32 tokens
    out = cluster.submit(p, greedy(10)).result(60)
    assert out.token_ids == colocated(tiny_model_dir, [p], [10])[0]

    # Ray restarts it (max_restarts=1); the router sees the new incarnation.
    def restarted():
        w = cluster.pool.get("prefill-0")
        return w.alive and w.info.peer.incarnation != old

    wait_until(restarted, timeout_s=60, interval_s=0.2, message="the prefill worker coming back")
    cluster.wait_until_drained()


def test_restarted_prefill_worker_rejoins_the_mesh(cluster, tiny_model_dir):
    done_before = sum(load.transfers_completed for w, load in cluster.loads().items() if w.startswith("decode"))
    ps = prompts(12, 3, VOCAB, lo=50, hi=90)
    got = [o.token_ids for o in cluster.generate(ps, greedy(8))]
    assert got == colocated(tiny_model_dir, ps, [8] * 3)
    loads = cluster.wait_until_drained()
    assert sum(load.transfers_completed for w, load in loads.items() if w.startswith("decode")) >= done_before + 3
    assert loads["prefill-0"].transfers_completed >= 3


def test_prefill_worker_killed_mid_prefill(cluster, tiny_model_dir):
    failed_before = _failed_transfers(cluster)
    p_actor = cluster.actor("prefill-0")
    p_actor.set_faults.remote(FaultSpec(delay_s=30.0, delay_next=1))  # hold the KV back until the kill
    p = prompts(13, 1, VOCAB, lo=1500, hi=1500)[0]  # 47 chunks of 32 tokens
    stream = cluster.submit(p, greedy(6))
    wait_until(
        lambda: any(load.num_reserved for w, load in cluster.loads().items() if w.startswith("decode")),
        timeout_s=30,
        message="a decode worker reserving blocks for the prompt",
    )
    ray.kill(p_actor, no_restart=True)
    out = stream.result(60)
    assert out.token_ids == colocated(tiny_model_dir, [p], [6])[0]
    assert _failed_transfers(cluster) == failed_before + 1  # counted, then prefilled on the decode worker
    cluster.wait_until_drained()


def test_decode_worker_killed_mid_stream_migrates_without_gaps(cluster, tiny_model_dir):
    """Tokens and their logprobs: none missing or repeated across the migration."""
    from engine.engine import LLMEngine
    from engine.sampling_params import SamplingParams
    from tests.e2e.helpers import engine_config

    ps = prompts(14, 3, VOCAB, lo=20, hi=60)
    n = 120
    params = SamplingParams(max_tokens=n, ignore_eos=True, logprobs=1)
    streams = [cluster.submit(p, params) for p in ps]
    first = next(iter(streams[0]))
    victim = cluster.dispatcher.placement(first.request_id)[0]
    seen = len(streams[0].token_ids)
    ray.kill(cluster.actor(victim), no_restart=True)
    outs = [s.result(120) for s in streams]
    assert [o.token_ids for o in outs] == colocated(tiny_model_dir, ps, [n] * 3)
    assert all(len(o.token_ids) == n for o in outs) and seen < n
    assert cluster.dispatcher.num_migrations >= 1
    want = LLMEngine(engine_config(tiny_model_dir)).generate(ps, params)
    for got, ref in zip(outs, want):
        assert [lp.token_id for lp in got.logprobs] == got.token_ids
        assert [lp.logprob for lp in got.logprobs] == pytest.approx([lp.logprob for lp in ref.logprobs], abs=1e-4)
    cluster.wait_until_drained()
