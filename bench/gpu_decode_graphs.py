"""Kept for GPU issues (gpu_check runs it): CUDA decode step time with and without CUDA graphs.

Decode step time on CUDA with and without CUDA graphs, and with the layer's elementwise steps as
Triton kernels or as torch ops: the same engine, the same batches, one run.

For each batch size, that many requests with prompts of ``--context`` random tokens are prefilled;
then the engine's full step (schedule, inputs, forward, sampling, outputs) is timed in rounds that
alternate the modes, and each mode reports its median step. The modes: ``graphs`` (the default
engine: graphs over the Triton layer kernels where they load), ``graphs_torch_ops`` (graphs
captured over the torch ops), ``eager`` (no graphs, torch ops: the engine before both). A
random-weight model with a published configuration, bf16.

    python -m bench.gpu_decode_graphs --model llama-3.2-1b [--sizes 1,8,32,64,128,256] [--json]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
from pathlib import Path


def measure(model_dir: Path, sizes: list[int], context: int, steps: int, rounds: int, kv_gb: float) -> dict:
    import torch

    from bench.host_step import start_decoding, time_steps
    from engine.config import CacheConfig, EngineConfig, SchedulerConfig
    from engine.engine import LLMEngine
    from engine.sampling_params import SamplingParams

    # The model's own context length, as served: graphs take block tables of that width.
    engine = LLMEngine(
        EngineConfig(
            model=str(model_dir),
            device="cuda",
            dtype="bfloat16",
            scheduler=SchedulerConfig(max_num_seqs=max(sizes), max_num_batched_tokens=8192),
            cache=CacheConfig(kv_cache_memory_gb=kv_gb),
        )
    )
    graphs = engine.runner.graphs
    if graphs is None:
        raise RuntimeError("the engine captured no CUDA graphs (not on CUDA with the Triton kernels?)")
    from dataclasses import replace

    from engine.cuda_graphs import DecodeGraphs
    from engine.model.reference_ops import TorchLayerOps

    runner, model = engine.runner, engine.runner.model
    default_kernels = model.kernels
    default_ops = default_kernels.layer_ops
    torch_kernels = replace(default_kernels, layer_ops=TorchLayerOps())
    model.use_kernels(torch_kernels)
    graphs_torch_ops = DecodeGraphs(
        model, runner.kv_cache, runner.attn, max_num_seqs=max(sizes), max_blocks=runner.batch.max_blocks
    )
    model.use_kernels(default_kernels)
    modes = {
        "graphs": (graphs, default_kernels),
        "graphs_torch_ops": (graphs_torch_ops, torch_kernels),
        "eager": (None, torch_kernels),
    }
    vocab = engine.model_config.vocab_size
    rng = random.Random(0)
    rows = []
    for bs in sizes:
        params = SamplingParams(max_tokens=2 * steps * rounds + 32, ignore_eos=True, detokenize=False)
        ids = start_decoding(engine, [[rng.randrange(vocab) for _ in range(context)] for _ in range(bs)], params)
        times: dict[str, list[float]] = {mode: [] for mode in modes}
        for _ in range(rounds):
            for mode, (mode_graphs, kernels) in modes.items():
                runner.graphs = mode_graphs
                model.use_kernels(kernels)
                time_steps(engine, 2)  # the switch's first steps are not timed
                times[mode] += time_steps(engine, steps)
        runner.graphs = graphs
        model.use_kernels(default_kernels)
        for i in ids:
            engine.abort(i)
        ms = {mode: statistics.median(t) * 1e3 for mode, t in times.items()}
        g, e = ms["graphs"], ms["eager"]
        rows.append(
            {
                "batch": bs,
                **{f"{mode}_ms": round(v, 3) for mode, v in ms.items()},
                "speedup": round(e / g, 2),
                "graphs_tok_s": round(bs / g * 1e3),
                "eager_tok_s": round(bs / e * 1e3),
            }
        )
        print(
            f"batch {bs:4d}: " + ", ".join(f"{mode} {v:7.2f} ms" for mode, v in ms.items()) + f"; {e / g:5.2f}x",
            flush=True,
        )
    assert engine.num_free_blocks == engine.num_total_blocks
    return {
        "device": torch.cuda.get_device_name(0),
        "layer_ops": type(default_ops).__name__,
        "context": context,
        "max_model_len": engine.max_model_len,
        "steps": steps,
        "rounds": rounds,
        "graph_sizes": graphs.sizes,
        "capture_seconds": round(graphs.capture_seconds, 2),
        "rows": rows,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--model", default="llama-3.2-1b", help="a published config (baton/perf/random_model.py) or a directory"
    )
    ap.add_argument("--sizes", default="1,8,32,64,128,256")
    ap.add_argument("--context", type=int, default=256, help="prompt tokens of every request")
    ap.add_argument("--steps", type=int, default=20, help="timed steps per mode and round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--kv-cache-gb", type=float, default=8.0)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    sizes = sorted({int(s) for s in a.sizes.split(",")})
    from baton.perf.random_model import PUBLISHED, build_random_model

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(a.model)
        if a.model in PUBLISHED:
            model_dir = build_random_model(a.model, Path(tmp) / a.model, device="cuda", dtype="bfloat16")
        r = measure(model_dir, sizes, a.context, a.steps, a.rounds, a.kv_cache_gb)
    r["model"] = a.model
    if a.json:
        print(json.dumps(r, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
