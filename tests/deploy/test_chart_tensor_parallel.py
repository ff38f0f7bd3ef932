"""Tensor-parallel pools in the Helm chart (a real helm, as tests/deploy/test_chart_render.py): the
GPU values' TP-2 decode pool renders into Baton's config with its pod offering as many GPUs as a
worker's ranks, and a TP size above a worker's GPUs is refused at render time, as Baton refuses it."""

from __future__ import annotations

import pytest

from baton.config import BatonConfig
from tests.deploy.chart import (
    CHART,
    RELEASE,
    baton_config,
    helm,
    one,
    ray_container,
    render,
    requires_helm,
    template_args,
    worker_group,
)

pytestmark = requires_helm

GPU = [CHART / "values-gpu.yaml"]


def _decode_pod(docs) -> tuple[dict, dict]:
    group = worker_group(one(docs, "RayCluster", f"{RELEASE}-baton"), "decode")
    return group, ray_container(group)


def test_the_gpu_values_run_tp2_decode_workers_on_pods_offering_two_gpus():
    docs = render(GPU)
    cfg = BatonConfig.model_validate(baton_config(docs))
    assert cfg.pool_tensor_parallel_size("decode") == 2 and cfg.pool_tensor_parallel_size("prefill") == 1
    assert (cfg.pools.decode.gpus, cfg.pools.decode.workers) == (2, 2)  # the group's total, per worker
    group, c = _decode_pod(docs)
    assert c["resources"]["limits"]["nvidia.com/gpu"] == c["resources"]["requests"]["nvidia.com/gpu"] == 2
    assert group["rayStartParams"]["num-gpus"] == "2"
    assert '\\"baton_decode\\": 1' in group["rayStartParams"]["resources"]  # one unit packs the whole group


def test_a_tp_size_reaches_the_config_and_every_cpu_rank_counts_its_threads():
    assert "tensor_parallel_size" not in baton_config(render())["pools"]["decode"]  # unset: the engine's
    two_workers = ("decode.tensorParallelSize=2", "decode.workersPerPod=2", "decode.resources.requests.cpu=2")
    cfg = BatonConfig.model_validate(baton_config(render((), (*two_workers, "decode.resources.limits.cpu=4"))))
    assert cfg.pool_tensor_parallel_size("decode") == 2
    # two TP-2 CPU workers: four ranks of one torch thread each, against the pod's CPU limit
    proc = helm(*template_args(sets=two_workers), check=False)
    assert proc.returncode != 0
    assert "the 4 torch threads the pod's CPU workers run" in proc.stderr and "x 2 tensor-parallel ranks" in proc.stderr


@pytest.mark.parametrize(
    "sets,message,pools",
    [
        (
            ("decode.gpusPerWorker=1",),
            "decode.gpusPerWorker (1) is less than its tensor-parallel size (2)",
            {"decode": {"gpus": 1, "tensor_parallel_size": 2}},
        ),
        (
            ("decode.gpusPerWorker=3",),
            "decode.gpusPerWorker (3) does not split into whole GPUs across its 2 tensor-parallel ranks",
            {"decode": {"gpus": 3, "tensor_parallel_size": 2}},
        ),
        (
            ("decode.gpusPerWorker=0.5",),
            "decode.gpusPerWorker (0.5) is less than its tensor-parallel size (2)",
            {"decode": {"gpus": 0.5, "tensor_parallel_size": 2}},
        ),
        # the pools' default: Baton's engine.tensor_parallel_size, for a pool that sets none
        (
            ("baton.engine.tensor_parallel_size=2",),
            "prefill.gpusPerWorker (1) is less than its tensor-parallel size (2)",
            {"prefill": {"gpus": 1}, "decode": {"gpus": 2}},
        ),
    ],
)
def test_a_tp_size_above_a_workers_gpus_is_refused_at_render_as_baton_refuses_it(sets, message, pools):
    proc = helm(*template_args(GPU, set_jsons=sets), check=False)  # --set-json: 0.5 stays a number
    assert proc.returncode != 0
    assert "values don't meet the specifications of the schema" not in proc.stderr, proc.stderr
    assert message in proc.stderr, proc.stderr
    engine = {"tensor_parallel_size": 2} if "engine" in sets[0] else {}
    with pytest.raises(ValueError, match=r"needs one GPU per rank|does not split into whole GPUs"):
        BatonConfig.model_validate({"engine": engine, "pools": pools})
