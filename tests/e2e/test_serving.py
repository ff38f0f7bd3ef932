"""The whole serving stack (``baton up`` in-process: embedded redis-server, Ray local pools, router
with HTTP and gRPC on loopback) driven by real clients: the ``openai`` package, raw HTTP, and a
gRPC client from the generated stubs."""

from __future__ import annotations

import concurrent.futures
import json
import statistics
import threading
import time
from typing import Any

import grpc
import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from baton.config import load_config
from baton.perf.loadgen.server_metrics import MetricsSample, parse_metrics
from router.grpc_gen.baton.v1 import generate_pb2 as pb
from router.grpc_gen.baton.v1 import generate_pb2_grpc as pbg
from tests.e2e.helpers import colocated
from tests.e2e.load_clients import completions_from_another_process
from tests.e2e.server_thread import ServerThread
from tests.waiting import wait_until

KEY, LIMITED_KEY = "sk-acme-test", "sk-limited-test"
INTERACTIVE_SLO = 2.5  # a TTFT bucket edge: the server's histogram then measures the SLO exactly


@pytest.fixture(scope="module")
def srv(ray_session, tiny_model_dir, monkeypatch_module):
    monkeypatch_module.setenv("BATON_TEST_ACME_KEY", KEY)
    monkeypatch_module.setenv("BATON_TEST_LIMITED_KEY", LIMITED_KEY)
    cfg = load_config(
        overrides={
            "model.path": str(tiny_model_dir),
            "model.served_name": "tiny",
            "engine.max_num_seqs": 8,
            "engine.max_num_batched_tokens": 256,
            "engine.kv_cache_memory_gb": 0.25,
            "router.http_port": 0,
            "router.grpc_port": 0,
            "pools.local_prefill_threshold": 32,
            "pools.max_restarts": 0,
            "auth.required": True,
            "tenants": [
                {"name": "acme", "api_key": {"env": "BATON_TEST_ACME_KEY"}},
                {"name": "limited", "api_key": {"env": "BATON_TEST_LIMITED_KEY"}, "requests_per_min": 6},
            ],
            "lanes": [
                {
                    "name": "interactive",
                    "ttft_slo_s": INTERACTIVE_SLO,
                    "tpot_slo_s": 0.5,
                    "weight": 8,
                    "priority": 0,
                    "queue_bound": 8,
                },
                {
                    "name": "batch",
                    "ttft_slo_s": 600,
                    "tpot_slo_s": 5,
                    "weight": 1,
                    "priority": 2,
                    "queue_bound": 64,
                    "batch_window_s": 0.2,
                    "durable": True,
                    "preemptible": True,
                },
            ],
            "classification.long_context_tokens": 100000,
        }
    )
    s = ServerThread(cfg).start()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


def client(srv) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{srv.http}/v1", api_key=KEY, max_retries=0, timeout=60)


def drained(srv, timeout=5.0):
    return srv.cluster.wait_until_drained(timeout)


def test_openai_chat_completions_and_streaming(srv):
    c = client(srv)
    chat = c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hello"}], max_tokens=8)
    assert chat.choices[0].message.role == "assistant" and chat.usage.completion_tokens == 8
    comp = c.completions.create(model="tiny", prompt="once upon a time", max_tokens=6)
    assert comp.usage.completion_tokens == 6 and comp.choices[0].finish_reason == "length"
    chunks = list(
        c.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "stream please"}],
            max_tokens=10,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert chunks[-1].usage.completion_tokens == 10 and chunks[-1].choices == []
    assert any(ch.choices and ch.choices[0].finish_reason == "length" for ch in chunks)
    assert isinstance(text, str)
    assert [m.id for m in c.models.list().data] == ["tiny"]
    drained(srv)


def test_greedy_through_the_stack_equals_the_engine(srv, tiny_model_dir):
    prompt = list(range(100, 180))  # token ids: no tokenizer round trip in the comparison
    want = colocated(tiny_model_dir, [prompt], [12])[0]
    r = httpx.post(
        f"{srv.http}/v1/completions",
        headers={"Authorization": f"Bearer {KEY}"},
        json={"model": "tiny", "prompt": prompt, "max_tokens": 12, "temperature": 0, "ignore_eos": True},
    )
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == srv.router.tokenizer.decode(want)
    drained(srv)


def test_logprobs_through_the_stack(srv):
    """Chat logprobs (the openai client), streamed completion logprobs, and an idempotent retry that
    replays them from Redis, over the real router and pools."""
    c = client(srv)
    chat = c.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "x " * 40}],
        max_tokens=6,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
        extra_body={"ignore_eos": True},
    )
    content = chat.choices[0].logprobs.content
    assert content is not None
    assert len(content) == chat.usage.completion_tokens == 6
    assert all(t.top_logprobs[0].logprob == t.logprob <= 0 for t in content)  # greedy: the most likely
    chunks = list(
        c.completions.create(
            model="tiny",
            prompt=list(range(50, 90)),
            max_tokens=5,
            temperature=0,
            logprobs=1,
            stream=True,
            extra_body={"ignore_eos": True},
        )
    )
    streamed = [
        v for ch in chunks if ch.choices and ch.choices[0].logprobs for v in ch.choices[0].logprobs.token_logprobs
    ]
    assert len(streamed) == 5
    h = {"Authorization": f"Bearer {KEY}", "Idempotency-Key": "idem-logprobs"}
    body = {"model": "tiny", "prompt": "replay me", "max_tokens": 4, "temperature": 0.8, "logprobs": 2}
    a = httpx.post(f"{srv.http}/v1/completions", headers=h, json=body).json()
    b = httpx.post(f"{srv.http}/v1/completions", headers=h, json=body).json()
    assert a["choices"][0]["logprobs"]["token_logprobs"]
    assert a["choices"][0]["logprobs"] == b["choices"][0]["logprobs"]
    # An evaluation harness's loglikelihood request: the prompt scored, with its continuation.
    score = httpx.post(
        f"{srv.http}/v1/completions",
        headers={"Authorization": f"Bearer {KEY}"},
        json={
            "model": "tiny",
            "prompt": list(range(60, 100)),
            "max_tokens": 1,
            "temperature": 0,
            "logprobs": 1,
            "echo": True,
        },
    ).json()
    lp = score["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == 41 and lp["token_logprobs"][0] is None
    assert all(v <= 0 for v in lp["token_logprobs"][1:]) and lp["top_logprobs"][0] is None
    text = score["choices"][0]["text"]  # the echoed prompt, then the continuation: text_offset indexes it
    spelled = [(t, o) for t, o in zip(lp["tokens"], lp["text_offset"]) if not t.startswith("bytes:")]
    assert len(spelled) > 20 and all(text[o : o + len(t)] == t for t, o in spelled), (text, lp["text_offset"])
    worded = httpx.post(
        f"{srv.http}/v1/completions",
        headers={"Authorization": f"Bearer {KEY}"},
        json={
            "model": "tiny",
            "prompt": "once upon a time",
            "max_tokens": 2,
            "temperature": 0,
            "logprobs": 0,
            "echo": True,
        },
    ).json()["choices"][0]
    lp, text = worded["logprobs"], worded["text"]
    assert text.startswith("once upon a time") and lp["text_offset"] == sorted(lp["text_offset"])
    assert all(
        text[o : o + len(t)] == t
        for t, o in zip(lp["tokens"], lp["text_offset"])
        if o > 0 and not t.startswith("bytes:")
    ), (text, lp["tokens"], lp["text_offset"])
    drained(srv)


def test_tokenize_counts_what_generation_sees(srv):
    h = {"Authorization": f"Bearer {KEY}"}
    msgs: list[ChatCompletionMessageParam] = [{"role": "user", "content": "count my tokens, please"}]
    tok = httpx.post(f"{srv.http}/tokenize", headers=h, json={"model": "tiny", "messages": msgs}).json()
    chat = client(srv).chat.completions.create(model="tiny", messages=msgs, max_tokens=1)
    assert tok["count"] == len(tok["tokens"]) == chat.usage.prompt_tokens  # the chat template included
    back = httpx.post(f"{srv.http}/detokenize", headers=h, json={"tokens": tok["tokens"]}).json()["prompt"]
    assert "count my tokens, please" in back
    text = httpx.post(f"{srv.http}/tokenize", headers=h, json={"prompt": "once upon a time"}).json()
    assert (
        text["count"]
        == client(srv).completions.create(model="tiny", prompt="once upon a time", max_tokens=1).usage.prompt_tokens
    )
    bad = httpx.post(f"{srv.http}/detokenize", headers=h, json={"tokens": [10**7]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens"
    drained(srv)


def test_n_choices_through_the_stack(srv):
    c = client(srv)
    msgs: list[ChatCompletionMessageParam] = [{"role": "user", "content": "tell me something"}]
    a = c.chat.completions.create(
        model="tiny", messages=msgs, max_tokens=8, n=3, temperature=1.0, seed=5, extra_body={"ignore_eos": True}
    )
    assert [ch.index for ch in a.choices] == [0, 1, 2] and a.usage.completion_tokens == 24
    texts = [ch.message.content for ch in a.choices]
    assert len(set(texts)) > 1  # seeds 5, 6, 7
    b = c.chat.completions.create(
        model="tiny", messages=msgs, max_tokens=8, n=3, temperature=1.0, seed=5, extra_body={"ignore_eos": True}
    )
    assert [ch.message.content for ch in b.choices] == texts  # and reproducible
    chunks = list(
        c.completions.create(
            model="tiny", prompt="a b c", max_tokens=4, n=2, temperature=0, stream=True, extra_body={"ignore_eos": True}
        )
    )
    by_index = {0: "", 1: ""}
    for ch in chunks:
        for choice in ch.choices:
            by_index[choice.index] += choice.text
    assert by_index[0] == by_index[1] != ""  # greedy: the same answer twice
    with grpc.insecure_channel(srv.grpc) as ch:  # and over gRPC
        req = pb.GenerateRequest(
            text="a b c", n=2, sampling=pb.SamplingParameters(max_tokens=4, temperature=0, ignore_eos=True)
        )
        replies = list(pbg.GenerationStub(ch).Generate(req, metadata=_grpc_md(), timeout=30))
    texts = ["".join(m.text for m in replies if m.index == i) for i in (0, 1)]
    assert texts[0] == texts[1] == by_index[0] and sum(m.finished for m in replies) == 2
    drained(srv)


def test_sse_framing_is_exact(srv):
    with httpx.stream(
        "POST",
        f"{srv.http}/v1/completions",
        headers={"Authorization": f"Bearer {KEY}"},
        json={"model": "tiny", "prompt": "frame", "max_tokens": 4, "stream": True},
    ) as r:
        raw = "".join(r.iter_text())
    events = raw.split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]"
    for e in events[:-2]:
        assert e.startswith("data: ") and "\n" not in e
        json.loads(e[len("data: ") :])
    drained(srv)


@pytest.mark.parametrize(
    "body, status, needle",
    [
        ({"model": "tiny", "prompt": "x", "max_tokens": 100000}, 400, "maximum context length"),
        ({"model": "tiny", "prompt": "x", "max_tokens": 4, "lane": "nope"}, 400, "lane"),
        ({"model": "tiny", "prompt": [5, 999999], "max_tokens": 4}, 400, "vocabulary"),
        ({"model": "tiny", "prompt": "x", "max_tokens": 4, "logit_bias": {"999999": 1}}, 400, "logit_bias"),
        ({"model": "tiny", "prompt": "x", "max_tokens": "ten"}, 400, "max_tokens"),
        ({"model": "tiny", "prompt": "x", "top_p": 2}, 400, "top_p"),
        ({"model": "tiny", "messages": "hi"}, 400, "prompt"),
        # checked by the router: on the worker, Ray could not pickle the error and took the worker for dead
        ({"model": "tiny", "prompt": "x", "max_tokens": 4, "stop_token_ids": [999999]}, 400, "stop_token_ids"),
    ],
)
def test_bad_inputs(srv, body, status, needle):
    r = httpx.post(f"{srv.http}/v1/completions", headers={"Authorization": f"Bearer {KEY}"}, json=body)
    assert r.status_code == status
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and needle in json.dumps(err)


def test_auth(srv):
    assert httpx.post(f"{srv.http}/v1/completions", json={"prompt": "x"}).status_code == 401
    bad = httpx.post(f"{srv.http}/v1/completions", headers={"Authorization": "Bearer nope"}, json={"prompt": "x"})
    assert bad.status_code == 401 and bad.json()["error"]["type"] == "authentication_error"
    for path in ("/health", "/ready", "/metrics"):
        assert httpx.get(f"{srv.http}{path}").status_code == 200
    with grpc.insecure_channel(srv.grpc) as ch:
        with pytest.raises(grpc.RpcError) as e:
            list(pbg.GenerationStub(ch).Generate(pb.GenerateRequest(text="x"), timeout=10))
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED


def _grpc_md():
    return (("authorization", f"Bearer {KEY}"),)


def test_grpc_generate_abort_deadline_health_reflection(srv):
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

    with grpc.insecure_channel(srv.grpc) as ch:
        stub = pbg.GenerationStub(ch)
        msgs = list(
            stub.Generate(
                pb.GenerateRequest(text="grpc hello", sampling=pb.SamplingParameters(max_tokens=7)),
                metadata=_grpc_md(),
                timeout=30,
            )
        )
        assert sum(len(m.token_ids) for m in msgs) == 7 and msgs[-1].finished and msgs[-1].usage.completion_tokens == 7
        ids = list(range(200, 240))
        tok = list(
            stub.Generate(
                pb.GenerateRequest(token_ids=pb.TokenIds(ids=ids), sampling=pb.SamplingParameters(max_tokens=3)),
                metadata=_grpc_md(),
                timeout=30,
            )
        )
        assert sum(len(m.token_ids) for m in tok) == 3

        # A deadline in the middle of a long generation aborts it in both pools.
        call = stub.Generate(
            pb.GenerateRequest(text="long", sampling=pb.SamplingParameters(max_tokens=3000, ignore_eos=True)),
            metadata=_grpc_md(),
            timeout=1.5,
        )
        with pytest.raises(grpc.RpcError) as e:
            for _ in call:
                pass
        assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        drained(srv, timeout=3)

        # The Abort RPC stops a running request.
        call = stub.Generate(
            pb.GenerateRequest(
                text="abort me",
                request_id="grpc-abort-1",
                sampling=pb.SamplingParameters(max_tokens=3000, ignore_eos=True),
            ),
            metadata=_grpc_md(),
            timeout=60,
        )
        next(call)
        assert stub.Abort(pb.AbortRequest(request_id="grpc-abort-1"), metadata=_grpc_md()).aborted
        last = None
        for message in call:
            last = message
        assert last is None or last.finish_reason == "abort"
        drained(srv, timeout=3)

        health = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        names = set(ProtoReflectionDescriptorDatabase(ch).get_services())
        assert {"baton.v1.Generation", "grpc.health.v1.Health"} <= names
        info = stub.GetModelInfo(pb.GetModelInfoRequest(), metadata=_grpc_md(), timeout=5)
        assert info.id == "tiny" and info.max_model_len > 0


def _aborted_total(srv) -> float:
    text = httpx.get(f"{srv.http}/metrics").text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("baton_requests_finished_total{") and 'finish_reason="abort"' in line
    )


def test_client_disconnect_aborts_and_frees_blocks(srv):
    aborted_before = _aborted_total(srv)
    with (
        httpx.Client(timeout=30) as h,
        h.stream(
            "POST",
            f"{srv.http}/v1/completions",
            headers={"Authorization": f"Bearer {KEY}"},
            json={"model": "tiny", "prompt": "keep going", "max_tokens": 3000, "ignore_eos": True, "stream": True},
        ) as r,
    ):
        lines = r.iter_lines()
        for _ in range(5):
            next(lines)
    t0 = time.monotonic()
    drained(srv, timeout=5.0)  # blocks are free again within seconds (unaborted: 3,000 tokens)
    assert time.monotonic() - t0 < 5.0
    # counted as finished with "abort" (it was not counted)
    wait_until(
        lambda: _aborted_total(srv) >= aborted_before + 1,
        timeout_s=5,
        interval_s=0.05,
        message="the aborted request in baton_requests_finished_total",
    )


def _interactive_ttft_counts(srv) -> tuple[float, float]:
    """(requests with TTFT <= the SLO, all requests) from the router's own TTFT histogram."""
    from prometheus_client.parser import text_string_to_metric_families

    within = total = 0.0
    for family in text_string_to_metric_families(httpx.get(f"{srv.http}/metrics").text):
        if family.name != "baton_time_to_first_token_seconds":
            continue
        for s in family.samples:
            if s.labels.get("lane") != "interactive":
                continue
            if s.name.endswith("_bucket") and float(s.labels["le"]) == INTERACTIVE_SLO:
                within += s.value
            elif s.name.endswith("_count"):
                total += s.value
    return within, total


def test_overload_gets_429_or_503_with_retry_after_and_admitted_ttft_within_slo(srv):
    # 24 clients resubmitting at once against 8 sequence slots and an 8-deep interactive queue, from
    # a process of their own: client threads here would share the in-process server's GIL. A few
    # requests first, so that the router's measured rates are the warm server's (run alone on a
    # loaded host, the cold first ones took 4-5 s).
    completions_from_another_process(srv.http, KEY, n=4, concurrency=2)
    within0, total0 = _interactive_ttft_counts(srv)
    results = completions_from_another_process(srv.http, KEY, n=96, concurrency=24)
    rejected = [r for r in results if r[0] in (429, 503)]
    admitted = [r[2] for r in results if r[0] == 200]
    assert rejected and all(r[1] is not None and int(r[1]) >= 1 for r in rejected)
    assert {r[0] for r in results} <= {200, 429, 503}
    assert admitted
    # p99 TTFT within the SLO, measured by the router itself (arrival -> first token).
    within, total = _interactive_ttft_counts(srv)
    assert total - total0 >= len(admitted) - 1
    # p99 of ~12 admitted requests is their slowest; one miss is allowed for a CPU the host's other
    # processes take from the server mid-run (admission cannot foresee it); the 3x bound still holds.
    missed = (total - total0) - (within - within0)
    assert missed <= max(1, 0.01 * (total - total0)), (within - within0, total - total0)
    p99 = statistics.quantiles(admitted, n=100)[98] if len(admitted) > 1 else admitted[0]
    assert p99 <= 3 * INTERACTIVE_SLO, sorted(admitted)[-10:]
    metrics = httpx.get(f"{srv.http}/metrics").text
    assert 'baton_requests_rejected_total{lane="interactive"' in metrics
    assert httpx.get(f"{srv.http}/health").status_code == 200
    drained(srv, timeout=30)


def test_rate_limit_429_with_retry_after(srv):
    codes = []
    for _ in range(8):
        r = httpx.post(
            f"{srv.http}/v1/completions",
            headers={"Authorization": f"Bearer {LIMITED_KEY}"},
            json={"model": "tiny", "prompt": "limited", "max_tokens": 2},
        )
        codes.append(r.status_code)
        if r.status_code == 429:
            assert int(r.headers["retry-after"]) >= 1 and r.json()["error"]["type"] == "rate_limit_error"
    assert codes[:6] == [200] * 6 and 429 in codes[6:]


def test_idempotency_key_runs_once(srv):
    def finished_total():
        text = httpx.get(f"{srv.http}/metrics").text
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("baton_requests_finished_total{")
        )

    body = {"model": "tiny", "prompt": "idempotent", "max_tokens": 6, "temperature": 0.9, "seed": None}
    h = {"Authorization": f"Bearer {KEY}", "Idempotency-Key": "idem-1"}
    before = finished_total()
    a = httpx.post(f"{srv.http}/v1/completions", headers=h, json=body).json()
    b = httpx.post(f"{srv.http}/v1/completions", headers=h, json=body).json()
    assert a["choices"][0]["text"] == b["choices"][0]["text"]
    # One more request, counted, shows the router past the retry's end; the count then holds the first
    # and this one only: the retry was served from the stored result.
    httpx.post(
        f"{srv.http}/v1/completions",
        headers={"Authorization": f"Bearer {KEY}"},
        json={"model": "tiny", "prompt": "after the retry", "max_tokens": 1},
    )
    wait_until(
        lambda: finished_total() >= before + 2,
        timeout_s=10,
        interval_s=0.05,
        message="the request after the retry to be counted",
    )
    assert finished_total() == before + 2
    other = httpx.post(f"{srv.http}/v1/completions", headers=h, json={**body, "prompt": "different"})
    assert other.status_code == 409


def test_a_queued_batch_jobs_id_is_taken_until_it_is_answered(srv):
    h = {"Authorization": f"Bearer {KEY}", "X-Request-Id": "dup-1"}
    body = {
        "model": "tiny",
        "prompt": "a batch job",
        "max_tokens": 48,
        "ignore_eos": True,
        "lane": "batch",
        "temperature": 0,
    }
    job: dict = {}
    t = threading.Thread(
        target=lambda: job.update(r=httpx.post(f"{srv.http}/v1/completions", headers=h, json=body, timeout=60))
    )
    t.start()
    wait_until(
        lambda: httpx.get(f"{srv.http}/v1/batches/dup-1", headers=h).status_code == 200,
        timeout_s=10,
        interval_s=0.02,
        message="the batch job journaled",
    )
    other = httpx.post(
        f"{srv.http}/v1/completions",
        headers=h,
        timeout=30,
        json={"model": "tiny", "prompt": "an interactive request", "max_tokens": 200, "ignore_eos": True},
    )
    assert other.status_code == 409  # was: admitted, then the job's run shared its stream (tokens lost, job hung)
    t.join(60)
    done = job["r"].json()
    assert job["r"].status_code == 200 and done["usage"]["completion_tokens"] == 48
    assert drained(srv)


def test_one_scrape_shows_the_whole_cluster(srv):
    httpx.post(
        f"{srv.http}/v1/completions",
        headers={"Authorization": f"Bearer {KEY}"},
        json={"model": "tiny", "prompt": "x " * 40, "max_tokens": 2},
    )  # disaggregated: every stage

    def both_workers_reported_a_step() -> bool:
        sample = parse_metrics(httpx.get(f"{srv.http}/metrics").text, MetricsSample(t=0.0, in_flight=0))
        return all(sample.worker_steps.get(w, 0) >= 1 for w in ("prefill/prefill-0", "decode/decode-0"))

    wait_until(both_workers_reported_a_step, timeout_s=10, interval_s=0.1, message="a load report from every worker")
    text = httpx.get(f"{srv.http}/metrics").text
    for worker in ("prefill-0", "decode-0"):
        assert f'worker="{worker}"' in text
    for name in (
        "baton_time_to_first_token_seconds_bucket",
        "baton_inter_token_latency_seconds_bucket",
        "baton_e2e_request_latency_seconds_bucket",
        "baton_request_queue_seconds_bucket",
        "baton_kv_cache_usage_ratio",
        "baton_prefix_cache_queries_total",
        "baton_kv_transfer_bytes_total",
        "baton_ttft_breakdown_seconds_bucket",
        "baton_requests_waiting",
        "baton_requests_running",
    ):
        assert name in text, name
    assert 'le="0.001"' in text and 'le="2560.0"' in text  # vLLM's TTFT bucket edges
    for stage in ("router_queue", "prefill_queue", "prefill_compute", "transfer", "decode_queue"):
        assert f'baton_ttft_breakdown_seconds_count{{lane="interactive",model="tiny",stage="{stage}"}}' in text
    # utilisation: both workers stepped, and a step's CPU time never exceeds its wall time
    sample = parse_metrics(text, MetricsSample(t=0.0, in_flight=0))
    for worker in ("prefill/prefill-0", "decode/decode-0"):
        assert sample.worker_steps[worker] >= 1
        assert 0 < sample.worker_busy_cpu_s[worker] <= sample.worker_busy_s[worker] + 0.01


def test_durable_batch_lane_survives_a_router_restart(srv, tiny_model_dir):
    prompts = [list(range(300 + 10 * i, 340 + 10 * i)) for i in range(4)]
    # Outputs long enough that a job is still running when the loop below looks: with 40 tokens it
    # once timed out in a full-suite run having seen all four journaled and none running (most
    # likely they had all finished between its looks).
    want = colocated(tiny_model_dir, prompts, [160] * 4)
    h = {"Authorization": f"Bearer {KEY}"}

    def submit(i):
        try:  # non-streaming, no explicit lane, long output: the batch lane (durable)
            httpx.post(
                f"{srv.http}/v1/completions",
                headers={**h, "X-Request-Id": f"durable-{i}"},
                json={
                    "model": "tiny",
                    "prompt": prompts[i],
                    "max_tokens": 160,
                    "ignore_eos": True,
                    "lane": "batch",
                    "temperature": 0,
                },
                timeout=30,
            )
        except httpx.HTTPError:
            pass  # the router dies under it: that is the point

    pool = concurrent.futures.ThreadPoolExecutor(4)
    futures = [pool.submit(submit, i) for i in range(4)]
    # Crash only once every job is journaled (the durability promise covers accepted jobs; a request
    # the router never journaled is the client's to retry) and one is running.
    journaled: set[int] = set()

    def all_journaled_and_one_running() -> bool:
        if len(journaled) == 4 and srv.router.batch is not None and srv.router.batch._running:
            return True
        journaled.update(
            i
            for i in set(range(4)) - journaled
            if httpx.get(f"{srv.http}/v1/batches/durable-{i}", headers=h).status_code == 200
        )
        return False

    wait_until(all_journaled_and_one_running, timeout_s=20, message=lambda: f"journaled {sorted(journaled)} of 4")
    srv.call(srv.server.crash_router())
    concurrent.futures.wait(futures, timeout=30)
    # Under the same id, as Ray restarts a replica: its dispatcher is still a new origin for the
    # workers (a re-claimed job was refused as a duplicate id and recorded failed before 2026-11-26).
    srv.call(srv.server.restart_router("router-0", job_idle_ms=1500))
    results: dict[int, dict[str, Any]] = {}  # the finished jobs' JSON
    last: dict[int, tuple[int, Any]] = {}  # each job's last poll: status code, body

    def all_done() -> bool:
        for i in set(range(4)) - set(results):
            r = httpx.get(f"{srv.http}/v1/batches/durable-{i}", headers=h)
            last[i] = (r.status_code, r.json())
            if r.status_code == 200 and r.json()["status"] == "done":
                results[i] = r.json()["result"]
        return len(results) == 4

    wait_until(
        all_done, timeout_s=90, interval_s=0.2, message=lambda: str({i: last[i] for i in last if i not in results})
    )
    for i in range(4):
        assert list(results[i]["token_ids"]) == want[i]
    drained(srv, timeout=20)  # the dead router's orphaned requests were aborted by the decode worker


def test_redis_going_away_and_coming_back(srv):
    h = {"Authorization": f"Bearer {KEY}"}
    redis = srv.server.redis
    redis.stop()
    try:
        r = httpx.post(
            f"{srv.http}/v1/completions",
            headers=h,
            json={"model": "tiny", "prompt": "degraded", "max_tokens": 4},
            timeout=30,
        )
        assert r.status_code == 200  # serving goes on: local rate limits, local prefix index
        assert httpx.get(f"{srv.http}/ready").status_code == 200
    finally:
        redis.restart()

    def reconnected() -> bool:
        if srv.router.state.available:
            return True
        srv.call(srv.router.state.redis.ping())
        return False

    wait_until(reconnected, timeout_s=10, interval_s=0.2, message="the router's Redis connection back")
    r = httpx.post(
        f"{srv.http}/v1/completions",
        headers={**h, "X-Request-Id": "after-redis"},
        json={"model": "tiny", "prompt": "back", "max_tokens": 4, "lane": "batch"},
        timeout=60,
    )
    assert r.status_code == 200
    assert httpx.get(f"{srv.http}/v1/batches/after-redis", headers=h).json()["status"] == "done"
