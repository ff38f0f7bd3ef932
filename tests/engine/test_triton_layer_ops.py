"""The Triton layer kernels (engine/model/triton_layer_ops.py) against the torch ops they replace on
CUDA: residual add + RMSNorm, the rotary embedding of q and k in the fused qkv rows, SiLU * up;
fp32, fp16 and bf16, shapes of SmolLM2, Qwen2.5 and the tiny test models (non-power-of-two widths,
head groups padded). Then the engine with those kernels (and the Triton attention) against
transformers token for token. Without a GPU the kernels run under Triton's interpreter, which must
be on before Triton is imported, so the cases run in a child process that reports JSON."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

_ROOT = Path(__file__).resolve().parents[2]
_MARKER = "TRITON_LAYER_OPS_JSON:"

# name -> (op, shape arguments, dtype)
CASES: dict[str, tuple[str, dict[str, Any], str]] = {
    "norm_smollm2_fp32": ("norm", dict(rows=7, hidden=576, delta=True), "float32"),
    "norm_no_delta_fp32": ("norm", dict(rows=3, hidden=64, delta=False), "float32"),
    "norm_qwen_bf16": ("norm", dict(rows=5, hidden=896, delta=True), "bfloat16"),
    "norm_fp16": ("norm", dict(rows=2, hidden=2048, delta=True), "float16"),
    "norm_wide_bf16": ("norm", dict(rows=2, hidden=4096, delta=True), "bfloat16"),  # 8 warps
    "norm_tiny_values_fp32": ("norm", dict(rows=3, hidden=576, delta=False, scale=1e-4), "float32"),  # eps matters
    "rope_smollm2_fp32": ("rope", dict(rows=6, heads=9, kv_heads=3, head_dim=64), "float32"),
    "rope_qwen_bf16": ("rope", dict(rows=4, heads=14, kv_heads=2, head_dim=64), "bfloat16"),
    "rope_tiny_head8_fp32": ("rope", dict(rows=5, heads=4, kv_heads=2, head_dim=8), "float32"),
    "rope_head128_fp16": ("rope", dict(rows=3, heads=8, kv_heads=8, head_dim=128), "float16"),
    "silu_smollm2_fp32": ("silu", dict(rows=5, dim=1536), "float32"),
    "silu_small_bf16": ("silu", dict(rows=3, dim=24), "bfloat16"),
    "silu_one_row_fp16": ("silu", dict(rows=1, dim=4864), "float16"),
}
_TOL = {"float32": 2e-6, "float16": 2e-3, "bfloat16": 1.6e-2}  # relative to each output's scale


def _child_cases() -> dict:
    import torch

    from engine.model.reference_ops import TorchLayerOps
    from engine.model.rope import RotaryEmbedding
    from engine.model.triton_layer_ops import TritonLayerOps, checked_triton_layer_ops

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    gen = torch.Generator().manual_seed(0)
    out: dict = {}

    def rand(*shape, dtype):
        return torch.randn(*shape, generator=gen).to(device=device, dtype=getattr(torch, dtype))

    def err(got, want):  # max error over the output's scale
        return float((got.float() - want.float()).abs().max() / want.float().abs().max().clamp_min(1e-6))

    for name, (op, a, dtype) in CASES.items():
        if op == "norm":
            h = rand(a["rows"], a["hidden"], dtype=dtype) * a.get("scale", 1.0)
            delta = rand(a["rows"], a["hidden"], dtype=dtype) if a["delta"] else None
            w = rand(a["hidden"], dtype=dtype)
            h_ref = h.clone()
            want = TorchLayerOps.add_rms_norm(h_ref, delta, w, 1e-6)
            got = TritonLayerOps.add_rms_norm(h, delta, w, 1e-6)
            out[name] = max(err(got, want), err(h, h_ref))
        elif op == "rope":
            rows, heads, kv, d = a["rows"], a["heads"], a["kv_heads"], a["head_dim"]
            rope = RotaryEmbedding.__new__(RotaryEmbedding)
            freqs = torch.arange(512, dtype=torch.float32)[:, None] / (10000.0 ** (torch.arange(0, d, 2) / d))[None, :]
            rope.cos, rope.sin = (f.to(device=device, dtype=getattr(torch, dtype)) for f in (freqs.cos(), freqs.sin()))
            qkv = rand(rows, (heads + 2 * kv) * d, dtype=dtype)
            positions = torch.randint(0, 512, (rows,), generator=gen).to(device)
            want_qkv = TorchLayerOps.rotate_qkv(qkv.clone(), positions, rope, heads, kv, d)
            got_qkv = TritonLayerOps.rotate_qkv(qkv, positions, rope, heads, kv, d)
            out[name] = max(err(g, w) for g, w in zip(got_qkv, want_qkv))
        else:
            gate_up = rand(a["rows"], 2 * a["dim"], dtype=dtype)
            out[name] = err(TritonLayerOps.silu_mul(gate_up), TorchLayerOps.silu_mul(gate_up))
    # Inputs the kernels do not take go to the torch ops (a strided row view, here).
    h = rand(4, 128, dtype="float32")[:, :64]
    w = rand(64, dtype="float32")
    out["strided_falls_back"] = err(
        TritonLayerOps.add_rms_norm(h, None, w, 1e-6), TorchLayerOps.add_rms_norm(h, None, w, 1e-6)
    )
    out["_self_check_passes"] = checked_triton_layer_ops(device, torch.float32) is not None
    out["_engine"] = _engine_case(device)
    return out


def _engine_case(device) -> dict:
    """Greedy tokens of the engine running the Triton attention and layer kernels, against
    transformers: the step a GPU runs, on tiny Llama and Qwen2 models. On CUDA the engine chooses
    the kernels at load and captures its decode graphs over them; on CPU they are set after load
    (the interpreter, no graphs)."""
    import random
    import tempfile
    from dataclasses import replace

    from engine.config import EngineConfig
    from engine.engine import LLMEngine
    from engine.model.triton_layer_ops import TritonLayerOps
    from engine.sampling_params import SamplingParams
    from tests.engine.hf_oracle import build_tiny_hf_model, hf_greedy, load_hf

    result = {}
    for arch in ("llama", "qwen2"):
        with tempfile.TemporaryDirectory() as tmp:
            d = build_tiny_hf_model(Path(tmp), arch, seed=1)
            rng = random.Random(0)
            prompts = [[rng.randrange(3, 512) for _ in range(rng.randint(1, 30))] for _ in range(4)]
            max_new = [rng.randint(1, 8) for _ in prompts]
            engine = LLMEngine(
                EngineConfig(model=str(d), dtype="float32", device=str(device), attention_backend="triton")
            )
            chosen = type(engine.runner.model.ops).__name__  # on CUDA the engine picks the kernels itself
            if device.type == "cpu":
                model = engine.runner.model
                model.use_kernels(replace(model.kernels, layer_ops=TritonLayerOps()))
            outs = engine.generate(
                prompts, [SamplingParams(max_tokens=n, ignore_eos=True, detokenize=False) for n in max_new]
            )
            result[arch] = {
                "got": [o.token_ids for o in outs],
                "want": hf_greedy(load_hf(d), prompts, max_new),
                "chosen": chosen,
                "device": device.type,
                "graph_steps": engine.runner.graphs.replays if engine.runner.graphs else None,
            }
    return result


@pytest.fixture(scope="module")
def results() -> dict:
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed")
    env = dict(os.environ, BATON_NATIVE_KERNELS="0")
    env.pop("TRITON_INTERPRET", None)
    if not torch.cuda.is_available():  # natively on a GPU (the interpreter of some Triton releases fails there)
        env["TRITON_INTERPRET"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_ROOT), env.get("PYTHONPATH", "")) if p)
    code = (
        "import json; from tests.engine.test_triton_layer_ops import _child_cases, _MARKER; "
        "print(_MARKER + json.dumps(_child_cases()), flush=True)"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=_ROOT, env=env, capture_output=True, text=True, timeout=600)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(_MARKER)]
    if proc.returncode != 0 or not lines:
        pytest.fail(f"child failed (rc={proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1][len(_MARKER) :])


@pytest.mark.parametrize("name", list(CASES))
def test_kernel_equals_the_torch_ops(results, name):
    assert results[name] <= _TOL[CASES[name][2]], f"{name}: error {results[name]:.3g}"


def test_inputs_the_kernels_do_not_take_fall_back(results):
    assert results["strided_falls_back"] == 0.0


def test_the_start_up_self_check_passes(results):
    assert results["_self_check_passes"] is True


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_engine_with_the_triton_kernels_equals_transformers(results, arch):
    case = results["_engine"][arch]
    assert case["got"] == case["want"]
    if case["device"] == "cuda":  # chosen at load, and the decode graphs captured over them
        assert case["chosen"] == "TritonLayerOps" and case["graph_steps"] > 0
