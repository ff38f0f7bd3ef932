"""GPU device hygiene, checked on CPU with a recorded ``set_device``: a worker binds its engine's GPU
before any CUDA work, the thread that runs the engine's steps binds it before its first step (CUDA's
current device is per thread and starts at 0), and a bare ``cuda`` (a Ray worker's one visible GPU)
is bound as device 0 too."""

import threading

import pytest
import torch

from decode_worker.worker import DecodeWorker
from engine.config import CacheConfig, EngineConfig
from engine.device import ThreadDevice, bind_config_device, bind_device
from engine.engine import LLMEngine
from kv_transfer.peer import StoreAddress
from prefill_worker.worker import PrefillWorker


class Recorded:
    def __init__(self):
        self.calls: list[tuple[str, torch.device]] = []

    def __call__(self, device: torch.device) -> None:
        self.calls.append((threading.current_thread().name, device))


def test_a_cuda_device_is_bound_with_its_index_and_a_cpu_is_left_alone():
    rec = Recorded()
    assert bind_device(torch.device("cuda:1"), rec) == torch.device("cuda:1")
    assert bind_device(torch.device("cuda"), rec) == torch.device("cuda:0")  # Ray's one visible GPU
    assert bind_device(torch.device("cpu"), rec) == torch.device("cpu")
    assert [d for _, d in rec.calls] == [torch.device("cuda:1"), torch.device("cuda:0")]


def test_a_config_binds_the_gpu_it_names():
    rec = Recorded()
    assert bind_config_device("cuda:3", rec) == torch.device("cuda:3")
    assert bind_config_device("cpu", rec) is None
    if not torch.cuda.is_available():
        assert bind_config_device("auto", rec) is None
    assert [d for _, d in rec.calls] == [torch.device("cuda:3")]


def test_each_thread_is_bound_once():
    rec = Recorded()
    td = ThreadDevice(torch.device("cuda:2"), rec)
    td.enter()
    td.enter()
    t = threading.Thread(target=lambda: (td.enter(), td.enter()), name="engine-loop")
    t.start()
    t.join()
    assert rec.calls == [
        (threading.current_thread().name, torch.device("cuda:2")),
        ("engine-loop", torch.device("cuda:2")),
    ]
    ThreadDevice(torch.device("cpu"), rec).enter()
    assert len(rec.calls) == 2


def test_the_engines_steps_bind_their_thread_before_running(tiny_model_dir):
    engine = LLMEngine(
        EngineConfig(
            model=str(tiny_model_dir), device="cpu", max_model_len=128, cache=CacheConfig(num_blocks=16, block_size=16)
        )
    )
    rec = Recorded()
    engine._thread_device = ThreadDevice(torch.device("cuda:1"), rec)  # what a cuda:1 engine holds; runs on CPU
    engine.step()
    t = threading.Thread(target=engine.step, name="engine-loop")
    t.start()
    t.join()
    assert [name for name, _ in rec.calls] == [threading.current_thread().name, "engine-loop"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the order is shown by a load that fails without CUDA")
@pytest.mark.parametrize("worker", [PrefillWorker, DecodeWorker])
def test_a_worker_binds_its_gpu_before_its_engine_loads(tiny_model_dir, worker):
    rec = Recorded()
    config = EngineConfig(model=str(tiny_model_dir), device="cuda:1", cache=CacheConfig(num_blocks=16))
    with pytest.raises(ValueError, match="CUDA is not available"):  # the engine's load: the first CUDA work
        worker("w-0", config, StoreAddress("127.0.0.1", 1), set_device=rec)
    assert [d for _, d in rec.calls] == [torch.device("cuda:1")]
