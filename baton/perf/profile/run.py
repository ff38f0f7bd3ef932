"""``baton profile`` end to end: time the grid, fit, measure the overheads, assemble the cost model."""

from __future__ import annotations

import datetime
import os
import platform
from collections.abc import Callable
from dataclasses import dataclass, replace

from baton.perf.profile.cost_model import CostModel, ModelGeometry, Overheads, TransferModel
from baton.perf.profile.fit import FitReport, fit_step_model, report
from baton.perf.profile.measure import (
    StepTimer,
    default_grid,
    engine_for_grid,
    fastest_per_point,
    quick_grid,
    typical_over_fastest,
)
from baton.perf.profile.step_shape import FEATURES

_CPU_KV_GB = 2.0  # what a serving worker's pool gets on CPU (engine.model_loader's default)
_GPU_KV_FRACTION = 0.8


@dataclass(frozen=True)
class ProfileOptions:
    model: str = "default"
    threads: int | None = 1  # a CPU worker runs one torch thread
    device: str = "auto"
    quick: bool = False
    measure_ray: bool = True  # Ray round trip and KV transfer between two actors (a few seconds)
    measure_neighbour: bool | None = None  # slowdown next to a busy worker (None: on CPU, unless quick)
    transfer: TransferModel | None = None  # given: not measured
    rpc_s: float | None = None  # given: not measured
    kv_cache_gb: float | None = None  # a serving worker's KV pool (default: as the engine sizes it)
    max_num_seqs: int = 256  # a serving worker's, to cap its pool as the engine does
    seed: int = 0


def machine_info() -> dict:
    import torch

    from engine.cpu_info import cpuinfo_field

    cpu = cpuinfo_field("model name") or platform.processor() or ""
    info = {
        "hostname": platform.node(),
        "platform": platform.platform(),
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "gpu": None,
    }
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def _serving_blocks(engine, opts: ProfileOptions) -> int:
    import torch

    from engine.kv_cache import kv_block_bytes

    bs = engine.block_manager.block_size
    block_bytes = kv_block_bytes(engine.model_config, bs, engine.runner.kv_cache.dtype)
    if opts.kv_cache_gb is not None:
        budget = opts.kv_cache_gb * 2**30
    elif engine.device.type == "cuda":
        budget = torch.cuda.mem_get_info(engine.device)[0] * _GPU_KV_FRACTION
    else:
        budget = _CPU_KV_GB * 2**30
    useful = opts.max_num_seqs * -(-engine.max_model_len // bs)
    return max(1, min(int(budget // block_bytes), useful))


def run_profile(opts: ProfileOptions, progress: Callable[[str], None] = lambda m: None) -> CostModel:
    from baton.perf.profile.overheads import kv_transfer_models, loop_overhead_s, ray_rpc_s

    load_before = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    if load_before is not None and load_before > 0.5:
        progress(
            f"warning: the machine is busy (load average {load_before:.1f}): other processes inflate "
            "and scatter the step times; profile on a quiet machine for planning"
        )
    grid = quick_grid() if opts.quick else default_grid()
    engine = engine_for_grid(opts.model, grid, opts.threads, opts.device, progress=progress)
    grid = grid.fit_to(engine.max_model_len, grid.repeats + 8)
    timer = StepTimer(engine, grid, seed=opts.seed)
    progress(
        f"timing {len(grid.decode) + len(grid.ragged)} decode, {len(grid.prefill)} prefill and "
        f"{len(grid.mixed)} mixed batch shapes on {engine.device} ({opts.threads or 'default'} threads)"
    )
    samples = timer.run(progress)
    coefs, fit = fit_samples(samples)
    progress(
        f"fit: median |error| {fit.median_abs_rel_error * 100:.1f}%, p90 {fit.p90_abs_rel_error * 100:.1f}%, "
        f"max {fit.max_abs_rel_error * 100:.1f}% over {fit.n} batch shapes"
    )
    loop_s = loop_overhead_s(timer)
    progress(f"engine-loop overhead: {loop_s * 1e3:.2f} ms per step")
    neighbour = opts.measure_neighbour
    if neighbour is None:
        neighbour = engine.device.type == "cpu" and not opts.quick
    slowdown = 0.0
    if neighbour:
        from baton.perf.profile.interference import neighbour_slowdown

        slowdown = neighbour_slowdown(timer, str(engine.model_dir), opts.threads, progress=progress)
        progress(f"slowdown per busy neighbour: {slowdown * 100:.0f}%")

    cfg = engine.model_config
    dtype = engine.runner.kv_cache.dtype
    elem = dtype.itemsize
    geometry = ModelGeometry(
        spec=opts.model,
        name=engine.model_dir.name,
        architecture=cfg.architecture,
        num_layers=cfg.num_hidden_layers,
        vocab_size=cfg.vocab_size,
        max_model_len=engine.max_model_len,
        dtype=str(dtype).replace("torch.", ""),
        kv_bytes_per_token=cfg.kv_bytes_per_token * elem,
        block_size=engine.block_manager.block_size,
        num_kv_blocks=_serving_blocks(engine, opts),
    )

    transfer, rpc_s, source = opts.transfer, opts.rpc_s, "measured"
    local_transfer = None
    if opts.measure_ray and rpc_s is None:
        import ray

        own = not ray.is_initialized()
        if own:
            ray.init(num_cpus=2, include_dashboard=False, configure_logging=False, log_to_driver=False)
        try:
            rpc_s = ray_rpc_s()
            progress(f"Ray call round trip: {rpc_s * 1e3:.2f} ms")
        finally:
            if own:
                ray.shutdown()
    if opts.measure_ray and transfer is None:
        geo = dict(
            layers=cfg.num_hidden_layers,
            kv_heads=cfg.num_key_value_heads,
            head_dim=cfg.head_dim,
            block_size=geometry.block_size,
        )
        transfer, local_transfer = kv_transfer_models(geo, progress=progress)
    if rpc_s is None:
        rpc_s, source = Overheads.rpc_s, "default (not measured)"
    overheads = Overheads(step_s=loop_s, rpc_s=rpc_s, output_s=rpc_s, source=source)
    return CostModel(
        device=engine.device.type,
        threads=opts.threads,
        model=geometry,
        coefficients=coefs,
        fit=fit,
        transfer=transfer or TransferModel(),
        overheads=overheads,
        machine={
            **machine_info(),
            "load_avg_at_start": load_before,
            "load_avg_at_end": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        },
        samples=tuple(samples),
        created=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        neighbour_slowdown=slowdown,
        local_transfer=local_transfer,
        typical_over_fastest=typical_over_fastest(samples),
    )


def fit_samples(samples: list) -> tuple[dict[str, float], FitReport]:
    """Coefficients and fit report from raw samples (the fastest repeat of each grid point)."""
    points = fastest_per_point(list(samples))
    missing = {"decode", "prefill"} - {s.kind for s in points}
    if missing:  # a model fitted on one kind predicts the other from nothing
        raise ValueError(f"the samples hold no {' or '.join(sorted(missing))} steps; profile both kinds")
    rows = [s.shape.features() for s in points]
    secs = [s.seconds for s in points]
    coefs = fit_step_model(rows, secs, FEATURES)
    return coefs, report(coefs, rows, secs, [s.kind for s in points])


def refit(cm: CostModel) -> CostModel:
    """The same measurements fitted again (after the feature set changed, say)."""
    if not cm.samples:
        raise ValueError("the cost model holds no samples to fit")
    coefs, fit = fit_samples(list(cm.samples))
    return replace(cm, coefficients=coefs, fit=fit, typical_over_fastest=typical_over_fastest(list(cm.samples)))


def summary(cm: CostModel) -> str:
    units = {
        "const": ("ms", 1e3),
        "multi_token": ("ms", 1e3),
        "tokens": ("ms/token", 1e3),
        "sampled": ("ms/row", 1e3),
        "decode_ctx_padded": ("us/token", 1e6),
        "decode_ctx_sum": ("us/token", 1e6),
        "prefill_pairs": ("ns/pair", 1e9),
    }
    lines = [f"cost model: {cm.model.name} ({cm.model.dtype}) on {cm.device}, {cm.threads} threads"]
    for name in FEATURES:
        u, k = units[name]
        lines.append(f"  {name:18s} {cm.coefficients.get(name, 0.0) * k:10.4f} {u}")
    if cm.fit:
        f = cm.fit
        kinds = ", ".join(f"{k} {v * 100:.1f}%" for k, v in f.by_kind.items())
        lines.append(
            f"  fit over {f.n} batch shapes: median |error| {f.median_abs_rel_error * 100:.1f}%, "
            f"p90 {f.p90_abs_rel_error * 100:.1f}%, max {f.max_abs_rel_error * 100:.1f}% ({kinds})"
        )
    lines.append(f"  next to a busy worker on the same host: steps {cm.neighbour_slowdown * 100:.0f}% slower")
    lines.append(
        f"  a typical repeat is {(cm.typical_over_fastest - 1) * 100:.1f}% slower than the fastest "
        "(the fit's); the simulator uses the typical"
    )
    t, o = cm.transfer, cm.overheads
    lines.append(
        f"  KV transfer: {t.bandwidth_bytes_per_s / 1e9:.2f} GB/s + {t.latency_s * 1e3:.1f} ms ({t.source}); "
        f"{cm.model.kv_bytes_per_token} bytes/token"
    )
    if cm.local_transfer is not None:
        lt = cm.local_transfer
        lines.append(
            f"  KV transfer, same host through shared memory: {lt.bandwidth_bytes_per_s / 1e9:.2f} GB/s + "
            f"{lt.latency_s * 1e3:.1f} ms ({lt.source})"
        )
    lines.append(f"  overheads: step {o.step_s * 1e3:.2f} ms, Ray call {o.rpc_s * 1e3:.2f} ms ({o.source})")
    lines.append(f"  serving KV pool: {cm.model.num_kv_blocks} blocks of {cm.model.block_size} tokens")
    return "\n".join(lines)
