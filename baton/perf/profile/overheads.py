"""The serving system's costs around a step, measured on this machine (torch, Ray).

- Engine-loop overhead: a worker does not call ``engine.step()`` bare; its ``EngineLoop`` runs
  tickers (load snapshot, deadlines) and hands each step's outputs to an outbox that a Ray call
  thread drains (the per-step batch the router long-polls). Measured as the extra time per step of
  the same decode batch driven through a real ``EngineLoop`` + ``Outbox`` with a polling thread,
  over the bare step.
- Ray call round trip: a trivial actor method through ``ray.get`` (every router -> worker call:
  reserve, generate_local, prefill, and each output poll).
- KV transfer: ``baton.perf.kv_transfer_bench`` between two actors with this model's cache geometry; latency
  and bandwidth from a line through the measured (bytes, seconds) points.
"""

from __future__ import annotations

import itertools
import pickle
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

from baton.perf.profile.cost_model import TransferModel


def _bare_steps(timer, batch: int, context: int, steps: int) -> list[float]:
    eng = timer.engine
    for _ in range(batch):
        timer._decoding(context, max_tokens=steps + 16)
    eng.step()  # a new batch's first step, untimed
    out = []
    for _ in range(steps):
        t0 = time.perf_counter()
        eng.step()
        out.append(time.perf_counter() - t0)
    timer._clear()
    return out


def _loop_steps(timer, batch: int, context: int, steps: int) -> list[float]:
    from decode_worker.outbox import Outbox
    from engine.engine_loop import EngineLoop
    from engine.worker_stats import queued_prefill_tokens

    rids = [timer._decoding(context, max_tokens=steps + 16) for _ in range(batch)]
    outbox = Outbox()
    for rid in rids:
        outbox.register(rid, "router")
    loop = EngineLoop(timer.engine, output_sink=outbox.put, name="profile-loop")
    loop.add_ticker(lambda e: queued_prefill_tokens(e.scheduler))  # the load snapshot a worker takes
    loop.add_ticker(lambda e: e.take_kv_events())
    stop = threading.Event()

    def poller() -> None:  # the Ray call thread answering the router's long poll (and pickling it)
        while not stop.is_set():
            pickle.dumps(outbox.poll("router", 0.05))

    t = threading.Thread(target=poller, daemon=True)
    t.start()
    # The main thread waits on an event (set by a step hook), never polling: a thread waking up to
    # look would itself take the GIL from the engine thread and inflate what is measured.
    marks: list[float] = []
    done = threading.Event()

    def mark(engine, so) -> None:
        marks.append(time.perf_counter())
        if len(marks) > steps:
            done.set()

    loop.add_after_step(mark)
    loop.start()
    done.wait(600)
    loop.stop()
    stop.set()
    outbox.close()
    t.join(1.0)
    timer._clear()
    return [b - a for a, b in itertools.pairwise(marks)]  # the first step (a new batch) is left out


def loop_overhead_s(timer, batch: int = 8, context: int = 128, steps: int = 10, rounds: int = 2) -> float:
    """Extra seconds per step when the engine runs inside a worker's loop (>= 0): bare and looped
    runs of the same batch alternate, and the medians are compared (noise only ever adds time)."""
    bare: list[float] = []
    looped: list[float] = []
    for _ in range(rounds):
        bare += _bare_steps(timer, batch, context, steps)
        looped += _loop_steps(timer, batch, context, steps)
    return max(0.0, statistics.median(looped) - statistics.median(bare))


class _Pong:
    def ping(self) -> int:
        return 1


def ray_rpc_s(calls: int = 40) -> float:
    """Median round trip of a trivial actor call (Ray must be initialized)."""
    import ray

    # Any: a Ray actor handle (its remote methods are typed at run time only)
    actor: Any = ray.remote(num_cpus=1)(_Pong).remote()
    ray.get(actor.ping.remote())
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        ray.get(actor.ping.remote())
        times.append(time.perf_counter() - t0)
    ray.kill(actor)
    return statistics.median(times)


def _line(pts: list[tuple[int, float]], source: str) -> TransferModel:
    """Latency + bytes / bandwidth, least squares through the (bytes, seconds) points."""
    n = len(pts)
    mb = sum(b for b, _ in pts) / n
    ms = sum(s for _, s in pts) / n
    var = sum((b - mb) ** 2 for b, _ in pts)
    slope = sum((b - mb) * (s - ms) for b, s in pts) / var if var else 0.0
    if slope <= 0:  # noisy: the largest transfer's average rate, no fixed cost
        b1, s1 = max(pts)
        return TransferModel(bandwidth_bytes_per_s=b1 / s1, latency_s=0.0, source=source)
    return TransferModel(bandwidth_bytes_per_s=1.0 / slope, latency_s=max(0.0, ms - slope * mb), source=source)


def kv_transfer_models(
    geometry: dict,
    lengths: tuple[int, ...] = (256, 512, 1024),
    repeats: int = 2,
    timeout_s: float = 240.0,
    progress: Callable[[str], None] = lambda m: None,
) -> tuple[TransferModel | None, TransferModel | None]:
    """(gloo pair group, same-host shared-memory path) from ``baton.perf.kv_transfer_bench``, which runs its own
    Ray instance; (None, None) when the measurement fails or takes longer than ``timeout_s``."""
    from baton.perf.kv_transfer_bench import run

    box: dict = {}

    def measure() -> None:
        try:
            box["r"] = run(list(lengths), repeats=repeats, geometry=geometry)
        except Exception as e:  # noqa: BLE001 - a failed measurement must not lose the whole profile
            box["error"] = e

    t = threading.Thread(target=measure, name="kv-transfer-bench", daemon=True)
    t.start()
    t.join(timeout_s)
    if "r" not in box:
        why = f"{type(box['error']).__name__}: {box['error']}" if "error" in box else f"no result in {timeout_s:.0f} s"
        progress(f"KV transfer not measured ({why}); using the defaults")
        return None, None
    rows = box["r"]["results"]
    pts = [(x["bytes"], x["latency_ms_median"] / 1e3) for x in rows]
    progress("KV transfer (gloo): " + ", ".join(f"{b / 2**20:.1f} MiB in {s * 1e3:.1f} ms" for b, s in pts))
    local = None
    if all("local_latency_ms_median" in x for x in rows):
        lpts = [(x["bytes"], x["local_latency_ms_median"] / 1e3) for x in rows]
        progress(
            "KV transfer (shared memory): " + ", ".join(f"{b / 2**20:.1f} MiB in {s * 1e3:.1f} ms" for b, s in lpts)
        )
        local = _line(lpts, "measured")
    return _line(pts, "measured"), local
