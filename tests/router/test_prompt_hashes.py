"""The router hashes a prompt's blocks as the worker that computes it does: for a longrope model
(Phi-3), a prompt longer than the original length under the long state's root, so it finds the
workers caching its prefix (pure Python)."""

from __future__ import annotations

import json
from pathlib import Path

from engine.block_manager import BlockManager
from engine.config import SchedulerConfig
from engine.request import Request
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler
from router.prompt_hashes import PromptHasher

BS, ORIGINAL, MAX_LEN = 4, 16, 64
PHI3 = {
    "architectures": ["Phi3ForCausalLM"],
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "vocab_size": 100,
    "max_position_embeddings": MAX_LEN,
    "original_max_position_embeddings": ORIGINAL,
    "rope_scaling": {"type": "longrope", "short_factor": [1.0] * 8, "long_factor": [2.0] * 8},
}


def _model_dir(tmp_path: Path, cfg: dict) -> Path:
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return tmp_path


def _sub(tmp_path: Path) -> Path:
    d = tmp_path / "llama"
    d.mkdir()
    return d


def _worker_hashes(prompt: list[int], salt: str | None) -> list[bytes]:
    """The hashes a worker enters for ``prompt`` (its scheduler decides the rotary state)."""
    bm = BlockManager(64, BS)
    sched = Scheduler(SchedulerConfig(), bm, MAX_LEN, long_rope_from=ORIGINAL)
    req = Request("r", prompt, SamplingParams(max_tokens=1), cache_salt=salt)
    sched.add_request(req)
    bm.update_block_hashes(req)
    return req.block_hashes


def test_a_prompt_past_the_original_length_hashes_as_its_worker_caches_it(tmp_path):
    hasher = PromptHasher.for_model(_model_dir(tmp_path, PHI3), BS, MAX_LEN)
    assert hasher.long_rope_from == ORIGINAL
    for n in (ORIGINAL, ORIGINAL + 1, 40):  # short (at the original length), then long
        prompt = list(range(3, 3 + n))
        for salt in (None, "tenant-a"):
            assert hasher.hashes(prompt, salt) == _worker_hashes(prompt, salt)
            assert hasher.first_block(prompt, salt) == _worker_hashes(prompt, salt)[0]
    short, long = list(range(3, 3 + ORIGINAL)), list(range(3, 3 + 40))
    assert hasher.hashes(long, None)[:4] != hasher.hashes(short, None)  # same tokens, other state: no affinity
    assert hasher.first_block([1, 2], None) is None


def test_without_a_long_state_prompts_hash_from_the_plain_root(tmp_path):
    """No ``config.json`` (a router under test), a model without longrope, or one served no longer
    than its original length (its workers never rotate long) hash every prompt plainly."""
    plain = PromptHasher(BS)
    prompt = list(range(3, 43))
    assert PromptHasher.for_model(tmp_path, BS, MAX_LEN) == plain
    llama = {k: v for k, v in PHI3.items() if k not in ("rope_scaling", "original_max_position_embeddings")}
    assert PromptHasher.for_model(_model_dir(_sub(tmp_path), llama), BS, MAX_LEN) == plain
    assert PromptHasher.for_model(_model_dir(tmp_path, PHI3), BS, ORIGINAL) == plain
    bm = BlockManager(64, BS)
    req = Request("r", prompt, SamplingParams(max_tokens=1))
    bm.update_block_hashes(req)
    assert plain.hashes(prompt, None) == req.block_hashes
