"""What each pool's workers are started with: their engine configs (no Ray needed), and what a
tensor-parallel worker's group asks of a real local Ray node."""

from typing import Any

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


@pytest.fixture
def ray_node():
    """A local Ray node shaped like one GPU node of a TP-2 decode pool: two (logical) GPUs and one
    unit of the pool's custom resource. The suite's other Ray users start their own."""
    import ray

    if ray.is_initialized():
        pytest.skip("a Ray instance is already running in this process")
    ray.init(
        num_cpus=2,
        num_gpus=2,
        resources={"baton_decode": 1},
        include_dashboard=False,
        configure_logging=False,
        log_to_driver=False,
    )
    yield ray
    ray.shutdown()


def test_a_tp2_worker_given_two_gpus_places_its_group_on_a_node_offering_two(ray_node):
    """A worker's cpus, gpus and custom resource are its group's total, split across its ranks'
    bundles: the group packs onto a node offering exactly that (asking them per rank, it never
    placed), the worker asks the first bundle's share, and the placement watch hears the totals."""
    ray = ray_node

    class Rank0:
        def assigned(self) -> dict[str, float]:
            return dict(ray.get_runtime_context().get_assigned_resources())

    remote: Any = ray.remote(Rank0)  # (an actor class: its methods are typed at run time only)

    seen = []
    f = WorkerFleet(
        EngineConfig(model="tiny"),
        PoolSpec("prefill", 0),
        PoolSpec("decode", 1, cpus=2.0, gpus=2.0, resources={"baton_decode": 1.0}, tensor_parallel_size=2),
        FleetOptions(actor_name_prefix="t"),
        on_spawn=lambda worker_id, name, demand: seen.append((worker_id, name, demand)),
    )
    try:
        rank0 = remote.options(**f._actor_options("decode", "decode-0")).remote()
        group = f._groups["decode-0"]
        assert ray.get(group.ready(), timeout=60) is not None
        assert [dict(b) for b in group.bundle_specs] == [{"CPU": 1.0, "GPU": 1.0, "baton_decode": 0.5}] * 2
        got = ray.get(rank0.assigned.remote(), timeout=60)
        assert {k: got[k] for k in ("CPU", "GPU", "baton_decode")} == {"CPU": 1.0, "GPU": 1.0, "baton_decode": 0.5}
        assert seen == [("decode-0", "t-decode-0", {"CPU": 2.0, "GPU": 2.0, "baton_decode": 1.0})]
    finally:
        f._remove_group("decode-0")
