"""Prefill and decode pools as Ray actors, KV over gloo: greedy outputs equal the colocated engine
and transformers token for token; chunked prefill ships several chunks; a shared prefix ships fewer
blocks; short prompts prefill locally; every pool is back to all-free blocks after each test. The
payloads' data plane runs through the NCCL-semantics double (kv_transfer/nccl_double.py), and no
payload operation may wait without its peer committed to the match."""

import pytest

from kv_transfer.nccl_double import NcclSemantics
from tests.e2e.helpers import colocated, greedy, nccl_violations, prompts, start_cluster
from tests.engine.hf_oracle import hf_greedy, load_hf
from tests.waiting import wait_until

VOCAB = 4096
DATA_PLANE = NcclSemantics()


@pytest.fixture(scope="module")
def c11(ray_session, tiny_model_dir):
    # Short prompts always local here (the threshold rule); the idle-prefill rule is tested on its own.
    c = start_cluster(
        tiny_model_dir, 1, 1, local_prefill_threshold=24, short_prompts_to_idle_prefill=False, kv_data_plane=DATA_PLANE
    )
    yield c
    violations = nccl_violations(c)
    c.shutdown()
    assert violations == []


@pytest.fixture(scope="module")
def c22(ray_session, tiny_model_dir):
    c = start_cluster(tiny_model_dir, 2, 2, kv_data_plane=DATA_PLANE)
    yield c
    violations = nccl_violations(c)
    c.shutdown()
    assert violations == []


def _transfer_blocks(cluster):
    loads = cluster.loads()
    return sum(load.transfer_bytes for w, load in loads.items() if w.startswith("decode"))


def test_1p1d_equals_colocated_and_transformers(c11, tiny_model_dir):
    ps = prompts(0, 6, VOCAB, lo=40, hi=150)  # with a 32-token budget every prompt takes several chunks
    max_new = [8, 16, 24, 12, 20, 16]
    outs = c11.generate(ps, [greedy(n) for n in max_new])
    got = [o.token_ids for o in outs]
    assert got == colocated(tiny_model_dir, ps, max_new)
    assert got == hf_greedy(load_hf(tiny_model_dir), ps, max_new)
    assert c11.dispatcher.num_disaggregated >= 6
    loads = c11.wait_until_drained()
    assert loads["decode-0"].transfers_completed >= 6 and loads["decode-0"].transfers_failed == 0


def test_logprobs_cross_the_transfer(c11, tiny_model_dir):
    """The first token is sampled on the prefill worker: its logprobs travel with the KV. Every
    token's equal transformers', disaggregated or prefilled locally."""
    import torch

    from engine.sampling_params import SamplingParams

    hf = load_hf(tiny_model_dir)
    long_ps, short_ps = prompts(11, 2, VOCAB, lo=40, hi=80), prompts(12, 2, VOCAB, lo=5, hi=15)
    disagg, local = c11.dispatcher.num_disaggregated, c11.dispatcher.num_local_prefills
    params = SamplingParams(max_tokens=6, ignore_eos=True, logprobs=3)
    outs = c11.generate(long_ps + short_ps, params)
    assert c11.dispatcher.num_disaggregated == disagg + 2 and c11.dispatcher.num_local_prefills == local + 2
    for p, out in zip(long_ps + short_ps, outs):
        assert [lp.token_id for lp in out.logprobs] == out.token_ids
        with torch.inference_mode():
            ref = torch.log_softmax(hf(torch.tensor([p + out.token_ids])).logits[0, len(p) - 1 : -1].float(), -1)
        for i, lp in enumerate(out.logprobs):
            assert lp.logprob == pytest.approx(ref[i, lp.token_id].item(), abs=1e-4)
            assert [t for t, _ in lp.top] == ref[i].topk(3).indices.tolist()
    c11.wait_until_drained()


def test_penalties_and_bias_across_the_transfer(c11, tiny_model_dir):
    """The first token is sampled on the prefill worker with the request's penalties and bias."""
    from engine.sampling_params import SamplingParams

    ps = prompts(14, 3, VOCAB, lo=40, hi=80)
    plain = [o.token_ids for o in c11.generate(ps, SamplingParams(max_tokens=12, ignore_eos=True))]
    params = SamplingParams(
        max_tokens=12, ignore_eos=True, repetition_penalty=1.4, frequency_penalty=0.3, logit_bias={plain[0][0]: -100.0}
    )
    disagg = c11.dispatcher.num_disaggregated
    got = [o.token_ids for o in c11.generate(ps, params)]
    assert c11.dispatcher.num_disaggregated == disagg + 3
    from engine.engine import LLMEngine
    from tests.e2e.helpers import engine_config

    eng = LLMEngine(engine_config(tiny_model_dir))
    assert got == [o.token_ids for o in eng.generate(ps, params)]
    assert got[0][0] != plain[0][0]  # the bias applied where the first token was sampled
    c11.wait_until_drained()


def test_prompt_logprobs_prefill_on_the_decode_worker(c11, tiny_model_dir):
    """Only decode workers report outputs, so a long prompt whose logprobs are wanted prefills there."""
    import torch

    from engine.sampling_params import SamplingParams

    p = prompts(13, 1, VOCAB, lo=60, hi=60)[0]
    disagg, local = c11.dispatcher.num_disaggregated, c11.dispatcher.num_local_prefills
    out = c11.generate([p], SamplingParams(max_tokens=2, ignore_eos=True, prompt_logprobs=1))[0]
    assert c11.dispatcher.num_disaggregated == disagg and c11.dispatcher.num_local_prefills == local + 1
    with torch.inference_mode():
        ref = torch.log_softmax(load_hf(tiny_model_dir)(torch.tensor([p])).logits[0].float(), -1)
    assert [lp.token_id for lp in out.prompt_logprobs] == p and out.prompt_logprobs[0].logprob is None
    for j in range(1, len(p)):
        assert out.prompt_logprobs[j].logprob == pytest.approx(ref[j - 1, p[j]].item(), abs=1e-4)
    c11.wait_until_drained()


def test_shared_prefix_ships_fewer_blocks(c11, tiny_model_dir):
    prefix = prompts(1, 1, VOCAB, lo=64, hi=64)[0]  # exactly 4 blocks of 16
    a, b = prompts(2, 2, VOCAB, lo=40, hi=40, prefix=prefix)  # 104 tokens = 7 blocks each
    before = _transfer_blocks(c11)
    first = c11.generate([a], greedy(8))[0]
    mid = _transfer_blocks(c11)
    second = c11.generate([b], greedy(8))[0]
    after = _transfer_blocks(c11)
    per_block = (mid - before) // 7
    assert mid - before == 7 * per_block
    assert after - mid == 3 * per_block  # the 4 prefix blocks were already on the decode worker
    assert [first.token_ids, second.token_ids] == colocated(tiny_model_dir, [a, b], [8, 8])
    c11.wait_until_drained()


def test_short_prompts_prefill_locally(c11, tiny_model_dir):
    local_before = c11.dispatcher.num_local_prefills
    ps = prompts(3, 3, VOCAB, lo=5, hi=20)
    got = [o.token_ids for o in c11.generate(ps, greedy(10))]
    assert c11.dispatcher.num_local_prefills == local_before + 3
    assert got == colocated(tiny_model_dir, ps, [10] * 3)
    c11.wait_until_drained()


def test_short_prompts_go_to_an_idle_prefill_worker_when_the_rule_is_on(c11, tiny_model_dir):
    c11.wait_until_drained()  # nothing queued on the prefill worker: it has room
    local, disagg = c11.dispatcher.num_local_prefills, c11.dispatcher.num_disaggregated
    c11.dispatcher.short_prompts_to_idle_prefill = True
    try:
        ps = prompts(5, 3, VOCAB, lo=5, hi=20)
        got = []
        for p in ps:  # one at a time, each once the router has seen P take the one before
            wait_until(lambda: c11.pool.prefill[0].dispatched_tokens == 0, message="the prefill backlog drains")
            got.append(c11.generate([p], greedy(10))[0].token_ids)
    finally:
        c11.dispatcher.short_prompts_to_idle_prefill = False
    assert c11.dispatcher.num_disaggregated == disagg + 3 and c11.dispatcher.num_local_prefills == local
    assert got == colocated(tiny_model_dir, ps, [10] * 3)
    c11.wait_until_drained()


def test_streaming_deltas_and_text(c11, tiny_model_dir):
    stream = c11.submit("a streamed prompt that is long enough to go through the prefill pool", greedy(12))
    deltas = list(stream)
    assert deltas[-1].finished and sum(len(d.new_token_ids) for d in deltas) == 12
    assert "".join(d.text_delta for d in deltas) == c11.tokenizer.decode(stream.token_ids)
    c11.wait_until_drained()


def test_2p2d_equals_colocated(c22, tiny_model_dir):
    ps = prompts(4, 10, VOCAB, lo=30, hi=200)
    max_new = [6, 18, 9, 30, 12, 7, 22, 15, 11, 25]
    got = [o.token_ids for o in c22.generate(ps, [greedy(n) for n in max_new])]
    assert got == colocated(tiny_model_dir, ps, max_new)
    loads = c22.wait_until_drained()
    assert all(loads[w].steps > 0 for w in ("prefill-0", "prefill-1", "decode-0", "decode-1"))


@pytest.mark.slow
def test_smollm2_disaggregated_equals_colocated_and_transformers(ray_session, default_model_dir):
    """The default model through one prefill and one decode worker (two of each run the tiny model
    here, ``c22``, and through the CLI, tests/baton/test_generate_2p2d.py)."""
    from engine.model.tokenizer import Tokenizer
    from tests.engine.test_golden_smollm2 import MAX_NEW, QUESTIONS

    tok = Tokenizer.from_dir(default_model_dir)
    ps = [tok.encode_chat([{"role": "user", "content": q}]) for q in QUESTIONS]
    cluster = start_cluster(default_model_dir, 1, 1, budget=32, blocks=256, kv_data_plane=DATA_PLANE)
    try:
        got = [o.token_ids for o in cluster.generate(ps, [greedy(n) for n in MAX_NEW])]
        assert cluster.dispatcher.num_disaggregated == len(ps)
        cluster.wait_until_drained()
    finally:
        cluster.shutdown()
    assert got == colocated(default_model_dir, ps, MAX_NEW, budget=32, blocks=256)
    assert got == hf_greedy(load_hf(default_model_dir), ps, MAX_NEW)


def test_local_path_over_shared_memory_equals_colocated(ray_session, tiny_model_dir):
    """KV caches in shared memory on one host: the decode worker copies the prefill worker's blocks
    straight out of its cache (ids on the wire, kv_transfer/local_kv.py); the outputs are exact."""
    from dataclasses import replace

    from baton.cluster import ClusterConfig, LocalCluster
    from tests.e2e.helpers import engine_config

    ecfg = engine_config(tiny_model_dir, budget=32, blocks=64)
    ecfg = replace(ecfg, cache=replace(ecfg.cache, shared_memory=True))
    c = LocalCluster(ClusterConfig(prefill_workers=1, decode_workers=1, engine=ecfg))
    try:
        peers = [w.info.peer for w in c.pool.all()]
        assert peers[0].locality.startswith("shm:") and len({p.locality for p in peers}) == 1
        ps = prompts(5, 6, VOCAB, lo=40, hi=150)
        max_new = [8, 16, 24, 12, 20, 16]
        got = [o.token_ids for o in c.generate(ps, [greedy(n) for n in max_new])]
        assert got == colocated(tiny_model_dir, ps, max_new, budget=32)
        loads = c.wait_until_drained()
        assert loads["decode-0"].transfers_completed == c.dispatcher.num_disaggregated >= 3
        assert loads["decode-0"].transfers_failed == 0
    finally:
        c.shutdown()


def test_an_id_re_sent_by_another_router_is_taken_over(c11, tiny_model_dir):
    """A restarted router, or another replica re-claiming a durable batch job, sends an id the decode
    worker still runs for the first router: the worker aborts that copy and serves the new one,
    the first router's stream ends with ``abort``, nobody marks the worker dead, no block leaks."""
    from engine.request_spec import RequestSpec
    from router.dispatcher import Dispatcher

    [p] = prompts(7, 1, VOCAB, lo=60, hi=60)
    first = c11.submit(p, greedy(3000), request_id="same-id")
    next(iter(first))  # running on the decode worker
    other = Dispatcher(c11.pool, router_id="router-b", local_prefill_threshold=24)
    other.start()
    try:
        second = other.submit(RequestSpec("same-id", tuple(p), greedy(30)))
        assert second.result(120).token_ids == colocated(tiny_model_dir, [p], [30])[0]
        assert first.result(60).finish_reason == "abort"
        assert all(w.alive for w in c11.pool.all())
    finally:
        other.stop()
    c11.wait_until_drained()


def test_a_refused_request_fails_alone_and_the_worker_stays_up(c11):
    """A worker that raises for one request (here: the same router sending an id it already runs)
    fails that request with the worker's reason; it is not taken for a dead worker, so its other
    requests are not migrated and it keeps serving."""
    from engine.request_spec import RequestSpec
    from router.dispatcher import Dispatcher
    from router.stream import RequestFailed

    [p] = prompts(8, 1, VOCAB, lo=60, hi=60)
    first = c11.submit(p, greedy(3000), request_id="dup-id")
    next(iter(first))
    twin = Dispatcher(
        c11.pool, router_id=c11.dispatcher.router_id, origin=c11.dispatcher.origin, local_prefill_threshold=24
    )
    with pytest.raises(RequestFailed, match="refused the request: ValueError: duplicate request id"):
        twin.submit(RequestSpec("dup-id", tuple(p), greedy(5))).result(60)
    assert all(w.alive for w in c11.pool.all()) and c11.dispatcher.num_migrations == 0
    assert c11.abort("dup-id")
    assert c11.generate([p], greedy(4))[0].finish_reason == "length"
    c11.wait_until_drained()
