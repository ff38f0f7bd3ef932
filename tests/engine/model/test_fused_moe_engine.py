"""The families' Triton kernels wired into a whole engine: a tiny Gemma 2 (sliding windows shorter
than the prompts, soft-capping, a query pre-attention scalar) and a tiny Qwen2-MoE (shared expert)
served with the Triton attention backend and the ``KernelSet``'s Triton windowed attention and fused
MoE experts (what engine/kernels.py picks on CUDA) generate the same greedy tokens as the torch path
(whose tokens the golden family suite checks against transformers), batched with chunked prefill.

Runs in a child process under ``TRITON_INTERPRET=1`` (natively on CUDA where there is one).
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

import pytest
import torch

from tests.engine.triton_child import run_triton_child

_MARKER = "FAMILY_KERNELS_JSON:"
FAMILIES = ["gemma2", "qwen2_moe"]


def _tokens(
    model_dir: Path, attention: Literal["torch", "triton"], triton_kernels: bool, calls: dict[str, int]
) -> list[list[int]]:
    from engine.config import CacheConfig, EngineConfig, SchedulerConfig
    from engine.engine import LLMEngine
    from engine.kernels import triton_family_kernels
    from engine.sampling_params import SamplingParams

    eng = LLMEngine(
        EngineConfig(
            model=str(model_dir),
            dtype="float32",
            attention_backend=attention,
            cuda_graphs=False,
            scheduler=SchedulerConfig(max_num_batched_tokens=16),
            cache=CacheConfig(block_size=4),
        )
    )
    model = eng.runner.model
    if triton_kernels:
        windowed, fused = triton_family_kernels()

        def counted(name: str, fn: Any) -> Any:
            def call(*args: Any) -> Any:
                calls[name] = calls.get(name, 0) + 1
                return fn(*args)

            return call

        windowed = replace(
            windowed, decode=counted("decode", windowed.decode), prefill=counted("prefill", windowed.prefill)
        )
        model.use_kernels(replace(model.kernels, windowed_attention=windowed, fused_moe=counted("moe", fused)))
    # Prompts past Gemma's window of 12 (and several of its 4-token blocks), decoding beyond it.
    prompts = [[(7 * i + 3 * j) % 500 + 3 for j in range(n)] for i, n in enumerate((30, 5, 19))]
    params = [SamplingParams(max_tokens=m, ignore_eos=True, detokenize=False) for m in (6, 14, 3)]
    return [o.token_ids for o in eng.generate(prompts, params)]


def _child_main() -> None:
    from tests.engine.model.family_oracle import build_family_model

    out: dict[str, dict[str, list[list[int]] | dict[str, int]]] = {}
    for family in FAMILIES:
        d = build_family_model(Path(sys.argv[1]) / family, family, seed=1)
        calls: dict[str, int] = {}  # filled by the triton run
        torch_tokens, triton_tokens = _tokens(d, "torch", False, calls), _tokens(d, "triton", True, calls)
        out[family] = {"torch": torch_tokens, "triton": triton_tokens, "calls": calls}
    print(_MARKER + json.dumps(out), flush=True)


@pytest.fixture(scope="module")
def tokens(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    pytest.importorskip("triton")
    pytest.importorskip("transformers")
    work = str(tmp_path_factory.mktemp("families"))
    return run_triton_child("tests.engine.model.test_fused_moe_engine", _MARKER, work, "families", timeout_s=900)


@pytest.mark.parametrize("family", FAMILIES)
def test_triton_family_kernels_generate_the_torch_paths_tokens(tokens: dict[str, dict[str, Any]], family: str) -> None:
    got = tokens[family]
    assert [len(t) for t in got["torch"]] == [6, 14, 3]
    assert got["triton"] == got["torch"]
    # The Triton kernels did the work: Gemma's layers all soft-cap (windowed attention), Qwen2-MoE's MoE.
    want = {"decode", "prefill"} if family == "gemma2" else {"moe"}
    assert {k for k, n in got["calls"].items() if n > 0} == want


def test_cpu_kernel_sets_keep_the_torch_paths() -> None:
    from engine.kernels import TORCH_WINDOWED, kernels_for

    k = kernels_for(torch.device("cpu"), torch.float32)
    assert k.windowed_attention is TORCH_WINDOWED and k.fused_moe is None
    assert kernels_for(torch.device("cpu"), torch.bfloat16).windowed_attention is TORCH_WINDOWED
