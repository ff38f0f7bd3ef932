"""Asynchronous scheduling (engine/async_step.py): the same tokens as synchronous steps and as
transformers, every stop at the same token, no block leaked; and the host really schedules step
n+1 while step n runs."""

import random
import threading

import pytest

from engine.config import CacheConfig, EngineConfig, SchedulerConfig
from engine.engine import LLMEngine
from engine.engine_loop import EngineLoop
from engine.request import FinishReason
from engine.sampling_params import SamplingParams
from tests.engine.hf_oracle import build_tiny_hf_model, hf_greedy, load_hf
from tests.waiting import wait_until


@pytest.fixture(scope="module")
def tiny_hf(tmp_path_factory):
    d = build_tiny_hf_model(tmp_path_factory.mktemp("llama"), "llama", seed=1)
    return d, load_hf(d)


def _engine(model_dir, on=True, sched=None, cache=None):
    # fp32 on every device, like the oracle (on a GPU machine this checks the CUDA path).
    return LLMEngine(
        EngineConfig(
            model=str(model_dir),
            dtype="float32",
            async_scheduling=on,
            scheduler=SchedulerConfig(**(sched or {})),
            cache=CacheConfig(**(cache or {})),
        )
    )


def _prompts(seed, n=8):
    rng = random.Random(seed)
    return [[rng.randrange(3, 512) for _ in range(rng.randint(1, 70))] for _ in range(n)]


def _run(engine, prompts, params):
    outs = engine.generate(prompts, params)
    assert engine.num_free_blocks == engine.num_total_blocks  # nothing leaked
    assert not engine.has_unfinished_requests()
    return outs


def _greedy(max_new):
    return [SamplingParams(max_tokens=n, ignore_eos=True, detokenize=False) for n in max_new]


@pytest.mark.parametrize(
    "case",
    [
        "batched",
        "chunked_prefill",  # prompts in chunks of 16 tokens, blocks of 8
        "preemption",  # a pool too small for the batch: preempted and recomputed
        "prefix_caching",  # a prompt that is an earlier request's prompt and generation
    ],
)
def test_greedy_tokens_equal_transformers(tiny_hf, case):
    d, hf = tiny_hf
    prompts = _prompts(3 if case == "preemption" else 0)
    max_new = [24] * len(prompts) if case == "preemption" else [random.Random(1).randint(1, 24) for _ in prompts]
    sched, cache = {
        "batched": ({}, {}),
        "chunked_prefill": ({"max_num_batched_tokens": 16}, {"block_size": 8}),
        "preemption": ({"admission_watermark": 0.0}, {"block_size": 4, "num_blocks": 40}),
        "prefix_caching": ({}, {"block_size": 4}),
    }[case]
    engine = _engine(d, sched=sched, cache=cache)
    if case == "prefix_caching":
        # Blocks filled by decodes are entered once their token is known; then other requests
        # start from the first ones' prompts and generations.
        first = _run(engine, prompts[:2], _greedy([24, 24]))
        prompts, max_new = [prompts[0] + first[0].token_ids[:20], prompts[1]], [6, 6]
        hits = engine.block_manager.num_prefix_hits
    got = [o.token_ids for o in _run(engine, prompts, _greedy(max_new))]
    assert got == hf_greedy(hf, prompts, max_new)
    if case == "prefix_caching":
        assert engine.block_manager.num_prefix_hits - hits >= 4 * ((len(prompts[0]) - 1) // 4)
    steps = engine.async_steps
    assert steps is not None and steps.num_overlapped > 0
    # max_tokens is known in advance: no request is computed past its last token.
    assert steps.num_discarded == 0
    if case == "preemption":
        assert engine.scheduler.num_preemptions > 0


def test_stop_tokens_stop_strings_and_seeds_end_where_synchronous_steps_do(tiny_model_dir):
    """Requests ending mid-generation (a stop token, a stop string), and seeded sampling (as the
    requests of an n > 1 request: one prompt, several seeds)."""
    sync = _engine(tiny_model_dir, on=False)
    prompts = ["tell a story", "once upon a time", "the quick brown fox"]
    full = sync.generate(prompts, [SamplingParams(max_tokens=20, ignore_eos=True) for _ in prompts])
    # A stop token that comes mid-way, and a stop string ending mid-way (inside a later token's text).
    stop_id = full[0].token_ids[6]
    stop_str = full[1].text[len(full[1].text) // 2 :][:3]
    params = [
        SamplingParams(max_tokens=20, ignore_eos=True, stop_token_ids=[stop_id]),
        SamplingParams(max_tokens=20, ignore_eos=True, stop=[stop_str]),
        SamplingParams(max_tokens=5, ignore_eos=True),
    ] + [SamplingParams(max_tokens=16, temperature=0.9, top_p=0.9, seed=s) for s in (1, 2, 3)]
    prompts += ["tell a story"] * 3
    on = _engine(tiny_model_dir)
    want, got = (
        [(o.token_ids, o.text, o.finish_reason, o.stop_reason) for o in _run(e, prompts, params)] for e in (sync, on)
    )
    assert got == want
    assert on.async_steps is not None and on.async_steps.num_discarded >= 2  # the stopped ones' next tokens
    assert want[0][3] == stop_id and len(want[0][0]) < 20
    assert want[1][3] == stop_str and len(want[1][0]) < 20


def test_an_abort_mid_run_ends_a_request_at_the_same_token(tiny_hf):
    """Aborted once it has streamed 3 tokens: synchronous or not, it delivered those 3 and no more
    (its token in flight is discarded), and the others are unchanged."""
    d, _ = tiny_hf
    prompts = _prompts(4, n=4)
    results = []
    for on in (False, True):
        engine = _engine(d, on)
        ids = [engine.add_request(None, p, sp) for p, sp in zip(prompts, _greedy([16] * 4))]
        got: dict[str, list[int]] = {i: [] for i in ids}
        finished = {}
        while engine.has_unfinished_requests():
            for out in engine.step():
                got[out.request_id] += out.new_token_ids
                if out.finished:
                    finished[out.request_id] = out.finish_reason
            if ids[0] not in finished and len(got[ids[0]]) >= 3:
                finished[ids[0]] = engine.abort(ids[0]).finish_reason
        assert engine.num_free_blocks == engine.num_total_blocks
        results.append(([got[i] for i in ids], [finished[i] for i in ids]))
        if on:
            assert engine.async_steps.num_discarded >= 1  # the aborted row's token in flight
    assert results[0] == results[1]
    assert len(results[1][0][0]) == 3 and results[1][1][0].value == "abort"


def test_the_next_step_is_scheduled_while_the_step_runs(tiny_hf):
    """Each decode step's forward waits, on the device thread, until the engine has scheduled the
    step after it: synchronous steps would never get there (and time out)."""
    d, hf = tiny_hf
    engine = _engine(d)
    scheduled, waited = [0], []
    schedule, execute = engine.scheduler.schedule, engine.runner.execute

    def counting_schedule():
        so = schedule()
        scheduled[0] += 1
        return so

    def gated_execute(so):
        index = scheduled[0]  # this step is the index-th scheduled
        if threading.current_thread() is not threading.main_thread() and so.counts and max(so.counts) == 1:
            wait_until(lambda: scheduled[0] > index, timeout_s=20, message="the next step's scheduling")
            waited.append(index)
        return execute(so)

    engine.scheduler.schedule, engine.runner.execute = counting_schedule, gated_execute
    prompts = _prompts(5, n=4)
    got = [o.token_ids for o in _run(engine, prompts, _greedy([12] * 4))]
    assert len(waited) >= 10  # the decode steps each ran beside the next one's scheduling
    assert got == hf_greedy(hf, prompts, [12] * 4)


def test_an_engine_loop_serves_with_asynchronous_steps(tiny_hf):
    """The pool workers' loop: requests added and outputs polled from other threads."""
    d, hf = tiny_hf
    prompts, max_new = _prompts(6, n=4), [5, 9, 13, 17]
    loop = EngineLoop(_engine(d))
    loop.start()
    try:

        def add(p, sp):
            return loop.call(lambda e: e.add_request(None, p, sp))

        ids = [add(p, sp) for p, sp in zip(prompts, _greedy(max_new))]
        got: dict[str, list[int]] = {i: [] for i in ids}
        done: set[str] = set()

        def poll():
            for out in loop.poll_outputs(0.05):
                got[out.request_id] += out.new_token_ids
                if out.finished:
                    done.add(out.request_id)
            return len(done) == len(ids)

        wait_until(poll, timeout_s=60, message=lambda: f"{len(done)} of {len(ids)} finished")
        assert [got[i] for i in ids] == hf_greedy(hf, prompts, max_new)
        wait_until(lambda: loop.call(lambda e: e.num_free_blocks == e.num_total_blocks), timeout_s=10)
    finally:
        loop.stop()


def test_a_failed_step_ends_its_requests_and_the_planned_ones_with_error(tiny_hf):
    """The forward raises on the device thread: the call collecting that step re-raises, its
    requests (and those of the step planned beside it) end with ERROR, no block stays taken, and
    the engine serves on."""
    d, hf = tiny_hf
    engine = _engine(d)
    prompts = _prompts(7, n=3)
    ids = [engine.add_request(None, p, sp) for p, sp in zip(prompts, _greedy([20] * 3))]
    for _ in range(4):
        engine.step()
    assert engine.async_steps is not None and engine.async_steps.busy  # decoding, a step in flight
    execute = engine.runner.execute

    def failing(so):
        engine.runner.execute = execute
        raise RuntimeError("injected step failure")

    engine.runner.execute = failing
    with pytest.raises(RuntimeError, match="injected"):
        for _ in range(3):
            engine.step()
    ends = {o.request_id: o.finish_reason for o in engine.step() if o.finished}
    assert ends == dict.fromkeys(ids, FinishReason.ERROR)
    assert not engine.has_unfinished_requests()
    assert engine.num_free_blocks == engine.num_total_blocks
    assert [o.token_ids for o in _run(engine, prompts[:1], _greedy([8]))] == hf_greedy(hf, prompts[:1], [8])


def test_the_setting_is_validated():
    with pytest.raises(ValueError, match="async_scheduling"):
        EngineConfig(model="tiny", async_scheduling="yes")  # type: ignore[arg-type]
