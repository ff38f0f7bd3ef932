"""Tensor-parallel settings as a user gives them: the CLI flags, the config schema and its checks,
and ``baton generate --tensor-parallel-size 3 --json`` on the default model against transformers."""

import json

import pytest

from baton.config import BatonConfig, load_config
from baton.fleet import PoolSpec, rank_share
from tests.baton.test_cli import baton
from tests.engine.hf_oracle import hf_greedy, load_hf


def test_pool_sizes_default_to_the_engines_and_the_flags_reach_the_config():
    cfg = BatonConfig()
    assert cfg.engine_config().tensor_parallel_size == 1
    assert cfg.pool_tensor_parallel_size("decode") == 1
    cfg = load_config(None, {"engine.tensor_parallel_size": 2, "pools.decode.tensor_parallel_size": 4})
    assert cfg.engine_config().tensor_parallel_size == 2
    assert (cfg.pool_tensor_parallel_size("prefill"), cfg.pool_tensor_parallel_size("decode")) == (2, 4)


def test_a_worker_needs_a_gpu_per_rank():
    with pytest.raises(
        ValueError,
        match=r"pools.decode: tensor_parallel_size=2 needs one GPU per rank, but a "
        r"worker is given gpus=1",
    ):
        BatonConfig.model_validate({"pools": {"decode": {"gpus": 1, "tensor_parallel_size": 2}}})
    with pytest.raises(ValueError, match=r"pools\.prefill: tensor_parallel_size=4"):
        BatonConfig.model_validate({"engine": {"tensor_parallel_size": 4}, "pools": {"prefill": {"gpus": 2}}})
    BatonConfig.model_validate({"pools": {"decode": {"gpus": 2, "tensor_parallel_size": 2}}})
    with pytest.raises(ValueError, match=r"pools.decode: gpus=3 does not split into whole GPUs across "):
        BatonConfig.model_validate({"pools": {"decode": {"gpus": 3, "tensor_parallel_size": 2}}})
    with pytest.raises(ValueError):
        BatonConfig.model_validate({"engine": {"tensor_parallel_size": 0}})


def test_a_pool_worker_splits_its_resources_across_its_ranks_bundles():
    """A worker's cpus, gpus and custom resource are its group's total: a TP-2 worker given 2 GPUs
    asks Ray for 2, and a node offering baton_decode: 1 packs the whole group."""
    spec = PoolSpec("decode", 1, cpus=2.0, gpus=2.0, resources={"baton_decode": 1.0}, tensor_parallel_size=2)
    assert spec.bundle() == {"CPU": 1.0, "GPU": 1.0, "baton_decode": 0.5}  # each of its two ranks
    assert spec.totals() == {"CPU": 2.0, "GPU": 2.0, "baton_decode": 1.0}
    assert PoolSpec("prefill", 1).bundle() == PoolSpec("prefill", 1).totals() == {"CPU": 1.0}
    with pytest.raises(ValueError, match=r"pools.prefill.tensor_parallel_size: 0 is too few"):
        PoolSpec("prefill", 1, tensor_parallel_size=0)


def test_a_share_rounds_down_to_rays_precision_so_the_bundles_fit_the_node():
    spec = PoolSpec("prefill", 1, cpus=1.0, resources={"baton_prefill": 1.0}, tensor_parallel_size=3)
    assert spec.bundle() == {"CPU": 0.3333, "baton_prefill": 0.3333}
    for ranks in range(1, 9):
        for total in (0.3, 1.0, 2.0, 7.0):
            units, whole = round(rank_share(total, ranks) * 1e4), round(total * 1e4)  # Ray's fixed point
            assert units * ranks <= whole < (units + 1) * ranks
    with pytest.raises(ValueError, match=r"pools.decode: CPU=0.0001 split across 2 ranks leaves a rank none"):
        PoolSpec("decode", 1, cpus=0.0001, tensor_parallel_size=2)


def test_a_pool_size_that_does_not_divide_the_heads_is_refused_before_any_worker_starts(tiny_model_dir):
    from baton.cluster import ClusterConfig, LocalCluster
    from engine.config import EngineConfig

    cfg = ClusterConfig(engine=EngineConfig(model=str(tiny_model_dir)), prefill_tensor_parallel_size=3)
    with pytest.raises(
        ValueError, match=r"pools.prefill.tensor_parallel_size=3 does not divide the model's 8 attention heads"
    ):
        LocalCluster(cfg)


def test_generate_refuses_a_size_that_does_not_divide_the_heads(tiny_model_dir):
    r = baton("generate", "--model", str(tiny_model_dir), "--tensor-parallel-size", "3", "--prompt", "hi", "--json")
    assert r.returncode != 0
    assert "tensor_parallel_size=3 does not divide the model's 8 attention heads" in r.stderr


@pytest.mark.slow
def test_generate_tp3_json_on_the_default_model_equals_transformers(default_model_dir):
    prompts = ["What is the capital of France?", "2+2=", "Write a haiku about the sea."]
    r = baton(
        "generate",
        "--model",
        str(default_model_dir),
        "--tensor-parallel-size",
        "3",
        "--max-tokens",
        "16",
        "--ignore-eos",
        "--json",
        *[a for p in prompts for a in ("--prompt", p)],
        timeout=600,
    )
    assert r.returncode == 0, r.stderr
    got = [json.loads(line) for line in r.stdout.splitlines()]
    ids = [o["token_ids"] for o in got]
    from engine.model.tokenizer import Tokenizer

    tok = Tokenizer.from_dir(default_model_dir)
    encoded = [tok.encode(p) for p in prompts]
    assert [o["num_prompt_tokens"] for o in got] == [len(e) for e in encoded]
    assert ids == hf_greedy(load_hf(default_model_dir), encoded, [16] * 3)
