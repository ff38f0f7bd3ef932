"""The engine's CUDA attention path, end to end, without a GPU: ``attention_backend="triton"`` runs
the Triton paged-attention and KV-write kernels inside the engine's own steps (decode, prefill over
a paged prefix, the two mixed in one step) under Triton's interpreter, with the compiled CPU kernels
off (``BATON_NATIVE_KERNELS=0``), so the rest of the step is the torch arithmetic a GPU runs. Greedy
outputs must equal transformers' token for token, batched, chunked, with prefix hits and with
preemption.

The kernel tests (tests/engine/attention/test_triton_kernels.py) check each kernel against the
reference on made-up inputs; this checks the wiring: the metadata the runner builds, the cache
views the model passes, the split of a mixed step. Each scenario runs twice: eagerly, and with
decode steps through the CUDA-graph path's padded static buffers (engine/cuda_graphs.py, run
without a graph here), so the padding rows are checked to write and read no KV. The interpreter
must be switched on before Triton is imported, so the engine runs in a child process."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

_ROOT = Path(__file__).resolve().parents[2]
_MARKER = "GOLDEN-TRITON:"

# name -> (prompts seed, shared prefix, engine options, max new tokens for every prompt or None)
SCENARIOS: dict[str, tuple[int, int, dict[str, dict[str, Any]], int | None]] = {
    "batched": (0, 0, {}, None),
    "chunked_mixed_steps": (1, 0, {"scheduler": {"max_num_batched_tokens": 16}, "cache": {"block_size": 8}}, None),
    "prefix_hits": (2, 24, {"cache": {"block_size": 8}}, None),
    "preemption": (3, 0, {"cache": {"block_size": 4, "num_blocks": 40}, "scheduler": {"admission_watermark": 0.0}}, 16),
}
# The wiring is the same for both (Qwen2 adds only the QKV bias, a torch op); `make test` runs Llama to
# stay within its time budget, `make test-extended` (BATON_EXTENDED_TESTS=1) both.
ARCHS = ["llama", "qwen2"] if os.environ.get("BATON_EXTENDED_TESTS") == "1" else ["llama"]


def _child_main(arch: str, work_dir: str) -> None:
    import random

    from engine.config import CacheConfig, EngineConfig, SchedulerConfig
    from engine.engine import LLMEngine
    from engine.sampling_params import SamplingParams
    from tests.engine.hf_oracle import build_tiny_hf_model, hf_greedy, load_hf

    # A 1,024-token context (wider than 512, as the test checks): the graphs' block tables are that
    # wide, so their decode kernel splits small batches into partitions (the split-K path and its
    # reduce, padding rows included). Two
    # layers, not three, and at most eight new tokens a prompt: the interpreter runs every kernel
    # call in Python, and more of the same calls check nothing new.
    model_dir = build_tiny_hf_model(Path(work_dir), arch, seed=1, max_position_embeddings=1024, num_hidden_layers=2)
    hf = load_hf(model_dir)
    results = {}
    for name, (seed, shared_prefix, options, fixed_new) in SCENARIOS.items():
        rng = random.Random(seed)
        prefix = [rng.randrange(3, 512) for _ in range(shared_prefix)]
        prompts = [prefix + [rng.randrange(3, 512) for _ in range(rng.randint(1, 40))] for _ in range(6)]
        max_new = [fixed_new or rng.randint(1, 8) for _ in prompts]
        want = hf_greedy(hf, prompts, max_new)
        for graphs in (False, True):
            engine = LLMEngine(
                EngineConfig(
                    model=str(model_dir),
                    dtype="float32",
                    attention_backend="triton",
                    scheduler=SchedulerConfig(**options.get("scheduler", {})),
                    cache=CacheConfig(**options.get("cache", {})),
                )
            )
            if graphs:
                engine.runner.capture_decode_graphs(capture=False)
            params = [SamplingParams(max_tokens=n, ignore_eos=True, detokenize=False) for n in max_new]
            outs = engine.generate(prompts[:1], params[:1]) + engine.generate(prompts[1:], params[1:])
            results[name + ("+graphs" if graphs else "")] = {
                "backend": engine.runner.attn.name,
                "layer_ops": type(engine.runner.model.ops).__name__,
                "got": [o.token_ids for o in outs],
                "want": want,
                "leaked_blocks": engine.num_total_blocks - engine.num_free_blocks,
                "prefix_hits": engine.block_manager.num_prefix_hits,
                "preemptions": engine.scheduler.num_preemptions,
                "graph_steps": engine.runner.graphs.replays if graphs else None,
                "context": engine.max_model_len,
                "padded_rows": engine.runner.graphs.padded_rows if graphs else None,
            }
    print(_MARKER + json.dumps(results), flush=True)


@pytest.fixture(scope="module", params=ARCHS)
def golden(request, tmp_path_factory) -> dict:
    if importlib.util.find_spec("triton") is None:  # looked up, not imported: the child imports it
        pytest.skip("triton is not installed")
    env = dict(os.environ, TRITON_INTERPRET="1", BATON_NATIVE_KERNELS="0")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_ROOT), env.get("PYTHONPATH", "")) if p)
    code = "import sys; from tests.engine.test_golden_triton import _child_main; _child_main(sys.argv[1], sys.argv[2])"
    work_dir = tmp_path_factory.mktemp(f"triton-{request.param}")
    proc = subprocess.run(
        [sys.executable, "-c", code, request.param, str(work_dir)],
        cwd=_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(_MARKER)]
    if proc.returncode != 0 or not lines:
        pytest.fail(f"child failed (rc={proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1][len(_MARKER) :])


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graphs"])
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_triton_attention_in_the_engine_equals_hf(golden: dict, scenario: str, graphs: bool) -> None:
    res = golden[scenario + ("+graphs" if graphs else "")]
    assert res["backend"] == "triton"
    assert res["layer_ops"] == "TorchLayerOps"
    assert res["got"] == res["want"]
    assert res["leaked_blocks"] == 0
    if scenario == "prefix_hits":
        assert res["prefix_hits"] >= 5 * (24 // 8) * 8  # five later prompts reuse the first one's 3 full blocks
    if scenario == "preemption":
        assert res["preemptions"] > 0
    if graphs:  # decode steps went through the padded static buffers, padding rows included
        assert res["graph_steps"] > 0 and res["padded_rows"] > 0
        assert res["context"] > 512  # wider than one decode partition: the graphs' kernel splits
