"""What the tensor-parallel tests share: a tiny Llama (2 KV heads) and an engine over a model at any TP size."""

import pytest

from engine.config import CacheConfig, EngineConfig, SchedulerConfig
from engine.engine import LLMEngine
from tests.engine.hf_oracle import build_tiny_hf_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny_hf_model(tmp_path_factory.mktemp("group-kv"), "llama", seed=3)


def tp_engine(model_dir, tp: int, scheduler: SchedulerConfig | None = None, **cache) -> LLMEngine:
    """An fp32 engine of ``tp`` ranks, one torch thread each, blocks of 4 tokens (``cache``: the rest
    of its CacheConfig)."""
    return LLMEngine(
        EngineConfig(
            model=str(model_dir),
            dtype="float32",
            tensor_parallel_size=tp,
            num_threads=1,
            scheduler=scheduler if scheduler is not None else SchedulerConfig(),
            cache=CacheConfig(block_size=4, **cache),
        )
    )


def group_engine(model_dir, tp: int) -> LLMEngine:
    """``tp_engine`` with 32 blocks."""
    return tp_engine(model_dir, tp, num_blocks=32)
