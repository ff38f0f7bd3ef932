"""What the group KV tests share: a tiny Llama (2 KV heads) and an engine over it at any TP size."""

import pytest

from engine.config import CacheConfig, EngineConfig
from engine.engine import LLMEngine
from tests.engine.hf_oracle import build_tiny_hf_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny_hf_model(tmp_path_factory.mktemp("group-kv"), "llama", seed=3)


def group_engine(model_dir, tp: int) -> LLMEngine:
    """An fp32 engine of ``tp`` ranks, one torch thread each, 32 blocks of 4 tokens."""
    return LLMEngine(
        EngineConfig(
            model=str(model_dir),
            dtype="float32",
            tensor_parallel_size=tp,
            num_threads=1,
            cache=CacheConfig(block_size=4, num_blocks=32),
        )
    )
