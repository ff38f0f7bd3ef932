"""Decode steps as CUDA graphs (engine/cuda_graphs.py). On CPU: the batch sizes, which steps the
graphs take, the config. On a GPU (skipped without one): the captured graphs against transformers
token for token, and against the eager path. The padded static-buffer forward itself is checked on
CPU, under the Triton interpreter, by tests/engine/test_golden_triton.py ("graphs" cases)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.attention.backend import select_backend
from engine.config import EngineConfig
from engine.cuda_graphs import MAX_GRAPH_BATCH, DecodeGraphs, graph_batch_sizes
from engine.input_batch import StepInputs

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def test_batch_sizes_pad_each_step_by_less_than_sixteen_rows():
    assert graph_batch_sizes(256) == [1, 2, 4, 8] + list(range(16, 257, 16))
    assert graph_batch_sizes(3) == [1, 2, 3]
    assert graph_batch_sizes(100) == [1, 2, 4, 8, 16, 32, 48, 64, 80, 96, 100]
    assert graph_batch_sizes(4096)[-1] == MAX_GRAPH_BATCH
    for top in (1, 7, 100, 256):
        sizes = graph_batch_sizes(top)
        for n in range(1, top + 1):
            size = min(s for s in sizes if s >= n)
            assert size - n < 16 and (n >= 16 or size < 2 * n)


def _uncaptured(max_num_seqs: int) -> DecodeGraphs:
    graphs = DecodeGraphs.__new__(DecodeGraphs)  # the size logic only: no model, no buffers
    graphs.sizes = graph_batch_sizes(max_num_seqs)
    return graphs


def _step(counts: list[int], scored: bool = False) -> StepInputs:
    total = sum(counts)
    ids = np.zeros(total, dtype=np.int64)
    return StepInputs(
        ids,
        ids,
        ids,
        ids,
        sum(1 for c in counts if c == 1),
        np.zeros((0, 1), np.int32),
        np.zeros(0, np.int32),
        np.zeros((0, 1), np.int32),
        np.zeros(1, np.int32),
        np.zeros(0, np.int32),
        ids,
        ids,
        [(0, 1, ids, ids)] if scored else [],
    )


def test_graphs_take_decode_steps_only():
    graphs = _uncaptured(64)
    assert graphs.size_for(1) == 1 and graphs.size_for(3) == 4 and graphs.size_for(17) == 32
    assert graphs.size_for(65) is None and graphs.size_for(0) is None
    assert graphs.takes(_step([1] * 5))
    assert not graphs.takes(_step([1, 1, 7]))  # a prefill chunk rides along: eager
    assert not graphs.takes(_step([1] * 65))  # larger than the largest graph
    assert not graphs.takes(_step([1, 1], scored=True))  # prompt logprobs to score


def test_graphs_refuse_the_torch_attention_path():
    with pytest.raises(ValueError, match="Triton"):
        DecodeGraphs(
            None,  # type: ignore[arg-type]  # never reached: the backend is refused first
            torch.zeros(1, 1, 2, 16, 1, 8),
            select_backend(torch.device("cpu"), "torch"),
            max_num_seqs=4,
            max_blocks=4,
            capture=False,
        )


def test_config_validates_cuda_graphs():
    assert EngineConfig().cuda_graphs is True
    with pytest.raises(ValueError, match="cuda_graphs"):
        EngineConfig(cuda_graphs="no")  # type: ignore[arg-type]  # the wrong type is the subject


def test_cpu_engine_captures_nothing(tiny_model_dir):
    from engine.engine import LLMEngine

    assert LLMEngine(EngineConfig(model=str(tiny_model_dir), device="cpu")).runner.graphs is None


# -- on a GPU ---------------------------------------------------------------------------------


def _gpu_engine(model_dir, graphs: bool, dtype: str = "float32", **kw):
    from engine.config import SchedulerConfig
    from engine.engine import LLMEngine

    return LLMEngine(
        EngineConfig(
            model=str(model_dir),
            device="cuda",
            dtype=dtype,
            cuda_graphs=graphs,
            scheduler=SchedulerConfig(max_num_seqs=kw.pop("max_num_seqs", 48)),
            **kw,
        )
    )


def _prompts(n: int, seed: int = 0):
    import random

    rng = random.Random(seed)
    prompts = [[rng.randrange(3, 512) for _ in range(rng.randint(1, 60))] for _ in range(n)]
    return prompts, [rng.randint(1, 40) for _ in range(n)]


def _greedy(engine, prompts, max_new):
    from engine.sampling_params import SamplingParams

    outs = engine.generate(prompts, [SamplingParams(max_tokens=m, ignore_eos=True, detokenize=False) for m in max_new])
    assert engine.num_free_blocks == engine.num_total_blocks
    return [o.token_ids for o in outs]


@cuda
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_graphs_equal_transformers_on_gpu(arch, tmp_path):
    from tests.engine.hf_oracle import build_tiny_hf_model, hf_greedy, load_hf

    # A 4,096-token context: the graphs' decode kernel splits these small batches (split-K, its reduce).
    d = build_tiny_hf_model(tmp_path, arch, seed=1, max_position_embeddings=4096)
    prompts, max_new = _prompts(37)  # the batch shrinks through many graph sizes, padded and exact
    engine = _gpu_engine(d, graphs=True)
    graphs = engine.runner.graphs
    assert graphs is not None and graphs.captured
    got = _greedy(engine, prompts, max_new)
    assert graphs.replays > 0 and graphs.padded_rows > 0
    assert got == hf_greedy(load_hf(d), prompts, max_new)


@cuda
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_graphs_equal_the_eager_path(tmp_path, dtype):
    from tests.engine.hf_oracle import build_tiny_hf_model

    d = build_tiny_hf_model(tmp_path, "llama", seed=2)
    prompts, max_new = _prompts(70, seed=3)
    eager = _greedy(_gpu_engine(d, graphs=False, dtype=dtype, max_num_seqs=80), prompts, max_new)
    engine = _gpu_engine(d, graphs=True, dtype=dtype, max_num_seqs=80)
    got = _greedy(engine, prompts, max_new)
    assert engine.runner.graphs.replays > 0
    if dtype == "float32":
        assert got == eager
    else:  # a padded batch may take another GEMM kernel, whose bf16 rounding can flip a near tie
        assert sum(g == e for g, e in zip(got, eager)) >= 0.9 * len(eager)
