"""What each pool's workers are started with (no Ray needed: the engine configs only)."""

import pytest

from baton.cluster import ClusterConfig
from baton.fleet import FleetOptions, PoolSpec, WorkerFleet
from engine.config import EngineConfig, SchedulerConfig


def fleet(prefill_workers: int, budget: int | None) -> WorkerFleet:
    engine = EngineConfig(model="tiny", scheduler=SchedulerConfig(max_num_batched_tokens=2048))
    return WorkerFleet(
        engine,
        PoolSpec("prefill", prefill_workers, threads=1),
        PoolSpec("decode", 1, threads=1),
        FleetOptions(decode_prefill_token_budget=budget),
    )


def test_a_disaggregated_decode_worker_caps_its_local_prefills_and_the_prefill_worker_does_not():
    f = fleet(prefill_workers=1, budget=256)
    assert f._engine_for("decode").scheduler.prefill_token_budget == 256
    assert f._engine_for("decode").scheduler.max_num_batched_tokens == 2048  # decodes keep the whole budget
    assert f._engine_for("prefill").scheduler.prefill_token_budget is None


def test_a_colocated_decode_worker_prefills_with_its_whole_budget():
    assert fleet(prefill_workers=0, budget=256)._engine_for("decode").scheduler.prefill_token_budget is None
    assert fleet(prefill_workers=1, budget=None)._engine_for("decode").scheduler.prefill_token_budget is None


def test_only_decode_workers_capture_cuda_graphs():
    f = fleet(prefill_workers=1, budget=None)
    assert f._engine_for("decode").cuda_graphs is True
    assert f._engine_for("prefill").cuda_graphs is False  # it never runs a decode step


def test_the_cluster_config_refuses_a_zero_budget():
    with pytest.raises(ValueError, match="decode_prefill_token_budget"):
        ClusterConfig(decode_prefill_token_budget=0)


def test_workers_given_gpus_must_run_on_cuda_and_say_so_where_it_is_missing():
    """A GPU pool's workers used device "auto", which fell back to the CPU where the image or torch
    had no CUDA: they served on CPU while holding the GPUs. They ask for CUDA now, and a process
    without it fails at load naming why."""
    import torch

    from engine.model_loader import pick_device

    f = WorkerFleet(EngineConfig(model="tiny"), PoolSpec("prefill", 1, gpus=1), PoolSpec("decode", 1, threads=1))
    assert f._engine_for("prefill").device == "cuda" and f._engine_for("decode").device == "auto"
    pinned = WorkerFleet(
        EngineConfig(model="tiny", device="cuda:1"), PoolSpec("prefill", 0), PoolSpec("decode", 1, gpus=1)
    )
    assert pinned._engine_for("decode").device == "cuda:1"  # an explicit choice is kept
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match=r"CUDA is not available: .*torch"):
            pick_device("cuda")


def test_generate_through_the_pools_keeps_its_threads_flag(monkeypatch):
    """`baton generate --threads N --decode-workers 1` ran its workers with one thread: the pools'
    default replaced the flag."""
    import baton.cluster
    from baton.cli import build_parser
    from baton.commands import generate

    seen = {}

    class Captured(Exception):
        pass

    def fake_cluster(cfg, progress=None):
        seen["cfg"] = cfg
        raise Captured

    monkeypatch.setattr(baton.cluster, "LocalCluster", fake_cluster)
    args = build_parser().parse_args(
        [
            "generate",
            "--model",
            "tiny",
            "--prompt",
            "hi",
            "--threads",
            "2",
            "--decode-workers",
            "1",
            "--prefill-workers",
            "0",
        ]
    )
    with pytest.raises(Captured):
        generate.run(args)
    assert seen["cfg"].torch_threads_per_worker == 2 and seen["cfg"].cpus_per_worker == 2.0
