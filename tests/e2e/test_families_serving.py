"""``baton up --model DIR`` for every family: the whole serving stack (embedded redis, router, one
prefill and one decode worker) serves a seeded tiny model of each family with its real chat template
(tests/engine/model/chat_templates.py), and a greedy chat answer over the OpenAI API equals
transformers' greedy continuation of the prompt token ids transformers' own tokenizer renders."""

from __future__ import annotations

import httpx
import pytest

from baton.config import load_config
from tests.e2e.server_thread import ServerThread
from tests.engine.hf_oracle import hf_greedy, load_hf
from tests.engine.model.chat_templates import FAMILY_FORMAT, FORMATS
from tests.engine.model.family_oracle import build_family_model

MAX_TOKENS = 8
# A conversation every template renders: a system turn only where the template takes one (Gemma 2 and
# Mistral's v0.1 templates refuse it), then alternating user and assistant turns.
_SYSTEM = {"role": "system", "content": "You answer in one short sentence."}
_TURNS = [
    {"role": "user", "content": "Hello there, what is the weather in Paris?"},
    {"role": "assistant", "content": "It is sunny and warm."},
    {"role": "user", "content": "And in London, tomorrow morning?"},
]


@pytest.mark.parametrize("family", list(FAMILY_FORMAT))
def test_chat_over_the_api_equals_transformers(ray_session, tmp_path, family):
    from transformers import AutoTokenizer

    d = build_family_model(tmp_path / family, family, seed=1, chat=True)
    messages = ([_SYSTEM] if FORMATS[FAMILY_FORMAT[family]].system else []) + _TURNS
    hf_tok = AutoTokenizer.from_pretrained(d)
    text = hf_tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    prompt_ids = hf_tok(text, add_special_tokens=False).input_ids
    want = hf_greedy(load_hf(d), [prompt_ids], [MAX_TOKENS])[0]

    srv = ServerThread(_config(d, family)).start()
    try:
        r = httpx.post(
            f"{srv.http}/v1/chat/completions",
            json={
                "model": family,
                "messages": messages,
                "max_tokens": MAX_TOKENS,
                "temperature": 0,
                "ignore_eos": True,
            },
            timeout=60,
        )
        assert r.status_code == 200, r.text
        body = r.json()
        assert srv.cluster.dispatcher.num_disaggregated == 1  # through the prefill worker, KV shipped
        srv.cluster.wait_until_drained(10.0)
    finally:
        srv.stop()
    usage = body["usage"]  # Baton rendered and tokenized the messages to the same ids
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (len(prompt_ids), MAX_TOKENS)
    assert body["choices"][0]["message"]["content"] == hf_tok.decode(want, skip_special_tokens=True)


def _config(model_dir, name):
    return load_config(
        overrides={
            "model.path": str(model_dir),
            "model.served_name": name,
            "engine.max_num_seqs": 4,
            "engine.max_num_batched_tokens": 32,  # the prompt prefills in several chunks
            "engine.block_size": 8,
            "engine.kv_cache_memory_gb": 0.02,
            "router.http_port": 0,
            "router.grpc_port": 0,
            "pools.local_prefill_threshold": 8,
            "pools.max_restarts": 0,
        }
    )
