"""Issue 43's "done when" on CPU: ``baton generate --prefill-workers 2 --decode-workers 2`` (two
prefill and two decode Ray workers, the KV shipped between them) gives the colocated engine's greedy
tokens, which are transformers' token for token."""

import json

from engine.model.tokenizer import Tokenizer
from tests.baton.test_cli import baton
from tests.engine.hf_oracle import hf_greedy, load_hf

PROMPTS = ["hello there, how are you today? " * 4, "short", "a prompt of a few more words, long enough for chunks"]


def test_two_by_two_pools_equal_colocated_and_transformers(tiny_model_dir):
    common = [
        "generate",
        "--model",
        str(tiny_model_dir),
        *[x for p in PROMPTS for x in ("--prompt", p)],
        "--max-tokens",
        "8",
        "--ignore-eos",
        "--json",
        "--max-num-batched-tokens",
        "16",
    ]
    local = baton(*common)
    pooled = baton(*common, "--prefill-workers", "2", "--decode-workers", "2", timeout=900)
    assert local.returncode == 0 and pooled.returncode == 0, pooled.stderr[-2000:]
    got = [json.loads(x) for x in pooled.stdout.splitlines()]
    assert [g["token_ids"] for g in got] == [json.loads(x)["token_ids"] for x in local.stdout.splitlines()]
    tok = Tokenizer.from_dir(tiny_model_dir)
    ids = [tok.encode(p) for p in PROMPTS]
    assert [len(i) for i in ids] == [g["num_prompt_tokens"] for g in got]
    assert [g["token_ids"] for g in got] == hf_greedy(load_hf(tiny_model_dir), ids, [8] * len(ids))
