"""Workers that share a GPU (a pool's fractional ``gpus``) size their KV cache from their share of it
(engine/kv_memory.py); the config's gpu_memory_utilization reaches every worker's engine."""

import pytest

from baton.config import BatonConfig
from baton.fleet import FleetOptions, PoolSpec, WorkerFleet
from engine.config import CacheConfig, EngineConfig


def test_a_fractional_gpu_worker_gets_that_fraction_and_a_whole_gpu_worker_all_of_it():
    engine = EngineConfig(model="tiny", cache=CacheConfig(gpu_memory_utilization=0.8))
    f = WorkerFleet(engine, PoolSpec("prefill", 1, gpus=0.5), PoolSpec("decode", 1, gpus=1.0), FleetOptions())
    assert f._engine_for("prefill").cache.gpu_fraction == 0.5
    assert f._engine_for("prefill").cache.gpu_memory_utilization == 0.8
    assert f._engine_for("decode").cache.gpu_fraction == 1.0
    cpu = WorkerFleet(engine, PoolSpec("prefill", 1), PoolSpec("decode", 1), FleetOptions())
    assert cpu._engine_for("decode").cache.gpu_fraction == 1.0


def test_the_config_carries_gpu_memory_utilization_and_refuses_a_bad_one():
    assert BatonConfig().engine_config().cache.gpu_memory_utilization == 0.9
    assert (
        BatonConfig.model_validate({"engine": {"gpu_memory_utilization": 0.5}})
        .engine_config()
        .cache.gpu_memory_utilization
        == 0.5
    )
    for bad in (0, 1.2):
        with pytest.raises(ValueError, match="gpu_memory_utilization"):
            BatonConfig.model_validate({"engine": {"gpu_memory_utilization": bad}})
