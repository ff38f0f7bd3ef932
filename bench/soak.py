"""``make soak``: Baton under mixed load while workers are killed and Redis restarts.

    python -m bench.soak [--duration 600] [--kill-every 60] [--model tiny] [--json OUT]

``baton up`` (1 prefill and 2 decode workers, its embedded Redis) serves interactive streams and
durable batch jobs (bench/soak_load.py) for ``--duration`` seconds; every ~``--kill-every`` seconds a
random worker process is killed (SIGKILL: Ray restarts it, the router migrates its requests), and
once, halfway, the embedded redis-server (``baton up`` starts it again). Everything is done from
outside, as a client and an operator's chaos tool would (bench/soak_processes.py). When the load
stops, the report says, and the run fails unless:

- no durable batch job is lost: each answered 200, was refused up front (429/503: the client was
  told), or has its result in ``GET /v1/batches/{id}``;
- every stream ended with a final chunk or an SSE error event; none hung;
- the streams in flight when a worker died (the ones that may have migrated) carry exactly the
  tokens of a fault-free rerun of the same greedy request: none missing or repeated;
- no KV block is held once the load stopped: every worker's KV usage, running and waiting go back
  to 0 (the pool invariant a client can see in ``/metrics``);
- the router's and every worker's resident memory grew less than 10% after warm-up.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

from bench.soak_checks import counts_by_ending, kv_held, lost_batch_jobs, refusals, rerun_mismatches
from bench.soak_load import Ending, LoadSpec, MixedLoad
from bench.soak_processes import Proc, RssTrack, cluster_processes

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class SoakConfig:
    duration_s: float = 600.0
    kill_every_s: float = 60.0
    warmup_s: float = 60.0  # RSS growth is measured from this far into the load (and into a process's life)
    model: str = "tiny"
    seed: int = 0
    rss_growth_limit: float = 0.10
    max_reruns: int = 60  # fault-free reruns of the streams that spanned a kill
    ready_timeout_s: float = 600.0
    load: LoadSpec = field(default_factory=LoadSpec)


@dataclass
class Fault:
    at_s: float  # seconds into the load
    what: str  # "kill prefill" | "kill decode" | "kill redis"
    pid: int
    monotonic: float


@dataclass
class SoakReport:
    config: dict
    duration_s: float
    faults: list[dict]
    counts: dict[str, dict[str, int]]  # kind -> ending -> requests
    refusals: dict[str, int]  # what the refused requests were told -> how many
    batch_lost: list[str]
    streams_unended: list[str]
    reruns: int
    rerun_mismatches: list[str]
    kv_held: dict[str, dict[str, float]]
    rss_growth: dict[str, float]
    failures: list[str]

    @property
    def passed(self) -> bool:
        return not self.failures


class BatonUpProcess:
    """``python -m baton up`` on free ports with the soak's config; its stderr kept."""

    def __init__(self, cfg: SoakConfig, workdir: Path) -> None:
        self.http_port, self.grpc_port = _free_port(), _free_port()
        config = workdir / "soak.yaml"
        config.write_text(
            json.dumps(
                {
                    "model": {"path": cfg.model},
                    "pools": {
                        "prefill": {"workers": 1},
                        "decode": {"workers": 2},
                        # every kill is a restart by Ray: no limit within a soak
                        "max_restarts": 10_000,
                    },
                }
            )
        )
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "baton",
                "up",
                "--config",
                str(config),
                "--http-port",
                str(self.http_port),
                "--grpc-port",
                str(self.grpc_port),
            ],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
        )
        self.lines: list[str] = []
        self._ready = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line.rstrip())
            if "ready in" in line:
                self._ready.set()

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not self._ready.wait(0.5):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("baton up did not get ready:\n" + "\n".join(self.lines[-40:]))

    def stop(self, timeout_s: float = 120.0) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- faults ----------------------------------------------------------------------------------------
async def inject_faults(
    up: BatonUpProcess, cfg: SoakConfig, load_start: float, stop: asyncio.Event, faults: list[Fault]
) -> None:
    """A random worker killed every ~``kill_every_s`` (±25%); the embedded Redis once, halfway."""
    rng = random.Random(cfg.seed + 1)
    redis_at = load_start + cfg.duration_s / 2
    next_kill = load_start + cfg.kill_every_s * rng.uniform(0.75, 1.25)
    while not stop.is_set():
        now = time.monotonic()
        due = min(next_kill, redis_at) if redis_at else next_kill
        try:
            await asyncio.wait_for(stop.wait(), max(0.0, due - now))
            return
        except TimeoutError:
            pass
        procs = cluster_processes(up.proc.pid)
        if redis_at and time.monotonic() >= redis_at:
            redis_at = 0.0
            targets = [p for p in procs if p.role == "redis"]
        else:
            next_kill = time.monotonic() + cfg.kill_every_s * rng.uniform(0.75, 1.25)
            targets = [p for p in procs if p.role in ("prefill", "decode")]
        if targets:
            victim = rng.choice(targets)
            _kill(victim)
            faults.append(
                Fault(round(time.monotonic() - load_start, 1), f"kill {victim.role}", victim.pid, time.monotonic())
            )


def _kill(p: Proc) -> None:
    try:
        os.kill(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


async def sample_rss(up: BatonUpProcess, track: RssTrack, stop: asyncio.Event, every_s: float = 5.0) -> None:
    while not stop.is_set():
        track.sample(await asyncio.to_thread(cluster_processes, up.proc.pid))
        try:
            await asyncio.wait_for(stop.wait(), every_s)
        except TimeoutError:
            pass


# -- the run ---------------------------------------------------------------------------------------
async def _soak(up: BatonUpProcess, cfg: SoakConfig, say) -> SoakReport:
    load = MixedLoad(up.url, cfg.load)
    stop_load, stop_faults = asyncio.Event(), asyncio.Event()
    faults: list[Fault] = []
    load_start = time.monotonic()
    track = RssTrack(cfg.warmup_s, time.time())
    tasks = [
        asyncio.create_task(inject_faults(up, cfg, load_start, stop_faults, faults)),
        asyncio.create_task(sample_rss(up, track, stop_faults)),
    ]
    loading = asyncio.create_task(load.run(stop_load))
    say(f"soak: {cfg.duration_s:g}s of load, a worker killed every ~{cfg.kill_every_s:g}s, Redis once")
    await asyncio.sleep(cfg.duration_s)
    stop_faults.set()
    stop_load.set()
    await asyncio.gather(*tasks)
    await loading  # the requests in flight run to their end (each within its patience)
    elapsed = time.monotonic() - load_start
    say(f"soak: load stopped after {elapsed:.0f}s; {len(load.records)} requests; checking")
    async with httpx.AsyncClient(base_url=up.url, timeout=60) as client:
        lost = await lost_batch_jobs(client, load.records)
        kills = [f.monotonic for f in faults if f.what != "kill redis"]
        reruns, mismatches = await rerun_mismatches(client, load.records, kills, cfg.max_reruns)
        held = await kv_held(client)
    unended = [
        f"{r.request_id}: {r.ending.value} ({r.detail})"
        for r in load.records
        if r.kind == "stream" and r.ending in (Ending.HUNG, Ending.FAILED)
    ]
    growth = track.growth()
    failures = []
    if lost:
        failures.append(f"{len(lost)} durable batch job(s) lost")
    if unended:
        failures.append(f"{len(unended)} stream(s) ended with neither a final chunk nor an error event")
    if mismatches:
        failures.append(f"{len(mismatches)} stream(s) spanning a worker's death differ from a fault-free rerun")
    if held:
        failures.append(f"KV blocks or requests still held after the load: {held}")
    over = {k: v for k, v in growth.items() if v >= cfg.rss_growth_limit}
    if over:
        failures.append(f"RSS grew {cfg.rss_growth_limit:.0%} or more after warm-up: {over}")
    redis_kills = [f for f in faults if f.what == "kill redis"]
    if not redis_kills:
        failures.append("no embedded redis-server was found to kill")
    elif not any(p.role == "redis" and p.pid != redis_kills[0].pid for p in track.samples):
        failures.append("the embedded redis-server did not come back after it was killed")
    return SoakReport(
        config=asdict(cfg),
        duration_s=round(elapsed, 1),
        faults=[{"at_s": f.at_s, "what": f.what, "pid": f.pid} for f in faults],
        counts=counts_by_ending(load.records),
        refusals=refusals(load.records),
        batch_lost=lost,
        streams_unended=unended,
        reruns=reruns,
        rerun_mismatches=mismatches,
        kv_held=held,
        rss_growth={k: round(v, 4) for k, v in growth.items()},
        failures=failures,
    )


def run_soak(cfg: SoakConfig, say=lambda m: print(m, file=sys.stderr, flush=True)) -> SoakReport:
    with tempfile.TemporaryDirectory(prefix="baton-soak-") as workdir:
        up = BatonUpProcess(cfg, Path(workdir))
        try:
            up.wait_ready(cfg.ready_timeout_s)
            say(f"soak: baton up ready at {up.url}")
            return asyncio.run(_soak(up, cfg, say))
        finally:
            up.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.split("\n\n")[0])
    p.add_argument("--duration", type=float, default=600.0, help="seconds of load (default 600)")
    p.add_argument("--kill-every", type=float, default=60.0, help="seconds between worker kills (about)")
    p.add_argument("--warmup", type=float, default=60.0, help="RSS growth is measured after this")
    p.add_argument("--model", default="tiny")
    p.add_argument("--interactive-rate", type=float, default=LoadSpec.interactive_rate)
    p.add_argument("--batch-rate", type=float, default=LoadSpec.batch_rate)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="write the report here")
    args = p.parse_args(argv)
    cfg = SoakConfig(
        duration_s=args.duration,
        kill_every_s=args.kill_every,
        warmup_s=args.warmup,
        model=args.model,
        seed=args.seed,
        load=LoadSpec(interactive_rate=args.interactive_rate, batch_rate=args.batch_rate, seed=args.seed),
    )
    report = run_soak(cfg)
    text = json.dumps(asdict(report), indent=2)
    if args.json:
        Path(args.json).write_text(text)
    print(text)
    print("soak: PASSED" if report.passed else "soak: FAILED: " + "; ".join(report.failures), file=sys.stderr)
    return 0 if report.passed else 1


if __name__ == "__main__":
    sys.exit(main())
