"""KV sizing on a GPU (engine/kv_memory.py), its arithmetic on a faked memory report: the cache is
utilization x gpus x total memory less what the process holds and its profiled peak, workers sharing
a GPU each get their share, and a worker that cannot fit one longest sequence fails naming the numbers."""

from typing import Any

import pytest
import torch

from engine.attention.backend import select_backend
from engine.config import CacheConfig, SchedulerConfig
from engine.kv_memory import MemoryReport, gpu_kv_blocks, profile_forward, profile_shape

GIB = 2**30
MIB = 2**20


def blocks(report, utilization=0.9, gpu_fraction=1.0, block_bytes=2 * MIB, min_blocks=8, useful=10**9):
    return gpu_kv_blocks(
        report,
        utilization=utilization,
        gpu_fraction=gpu_fraction,
        block_bytes=block_bytes,
        min_blocks=min_blocks,
        max_useful_blocks=useful,
    )


def test_the_cache_is_the_share_of_total_memory_less_held_and_peak():
    h200 = MemoryReport(total=140 * GIB, held=16 * GIB, peak=4 * GIB)
    assert blocks(h200) == int((0.9 * 140 - 16 - 4) * GIB) // (2 * MIB)
    assert blocks(h200, utilization=0.5) == (70 - 20) * GIB // (2 * MIB)
    assert blocks(h200, useful=1000) == 1000  # more than the config can use is not allocated


def test_workers_sharing_a_gpu_each_get_their_fraction():
    # Two half-GPU workers, started together: each sizes from the total, not from what the other left free.
    each = MemoryReport(total=80 * GIB, held=3 * GIB, peak=1 * GIB)
    half = blocks(each, gpu_fraction=0.5)
    assert half == int((0.9 * 0.5 * 80 - 4) * GIB) // (2 * MIB)
    assert 2 * (half * 2 * MIB + 4 * GIB) <= 0.9 * 80 * GIB  # together within the utilization


def test_a_worker_that_cannot_fit_its_minimum_fails_naming_the_numbers():
    small = MemoryReport(total=24 * GIB, held=15 * GIB, peak=3 * GIB)
    with pytest.raises(ValueError) as e:
        blocks(small, gpu_fraction=0.5, min_blocks=8192)
    msg = str(e.value)
    for words in (
        "8192 blocks",
        "gpu_memory_utilization 0.9",
        "gpus 0.5",
        "24.00 GiB",
        "10.80 GiB",
        "15.00 GiB",
        "3.00 GiB",
        "0.00 GiB",
    ):
        assert words in msg, (words, msg)
    assert blocks(small, min_blocks=1) == int((0.9 * 24 - 18) * GIB) // (2 * MIB)


def test_the_profile_is_the_largest_step_the_config_allows():
    assert profile_shape(SchedulerConfig(max_num_seqs=256, max_num_batched_tokens=2048), 4096) == [8] * 256
    assert profile_shape(SchedulerConfig(max_num_seqs=3, max_num_batched_tokens=100), 4096) == [34, 33, 33]
    assert profile_shape(SchedulerConfig(max_num_seqs=1, max_num_batched_tokens=8192), 2048) == [2048] * 4
    shape = profile_shape(SchedulerConfig(max_num_seqs=1024, max_num_batched_tokens=100), 4096)
    assert shape == [1] * 100


def test_gpu_settings_are_validated_where_built():
    assert CacheConfig().gpu_memory_utilization == 0.9 and CacheConfig().gpu_fraction == 1.0
    bads: tuple[Any, ...] = (0, 1.5, -0.1, True, "0.9")  # wrong types among them: validation is the subject
    for bad in bads:
        with pytest.raises(ValueError, match="gpu_memory_utilization"):
            CacheConfig(gpu_memory_utilization=bad)
        with pytest.raises(ValueError, match="gpu_fraction"):
            CacheConfig(gpu_fraction=bad)


def test_the_profiling_forward_runs_a_real_model_with_its_own_scratch_cache(tiny_model_dir):
    from engine.config import EngineConfig
    from engine.kv_cache import allocate_kv_cache
    from engine.model_loader import load_model

    loaded = load_model(
        EngineConfig(
            model=str(tiny_model_dir), device="cpu", max_model_len=256, cache=CacheConfig(num_blocks=4, block_size=16)
        )
    )
    made = []

    def new_cache(n):
        made.append(n)
        return allocate_kv_cache(loaded.model_config, n, 16, torch.float32, torch.device("cpu"))

    forward = profile_forward(loaded.model, select_backend(torch.device("cpu"), "torch"), [40, 3, 17], 16, new_cache)
    forward()
    assert made == [3]  # the longest chunk's blocks, shared by every chunk
