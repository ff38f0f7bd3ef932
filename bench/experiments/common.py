"""What every experiment shares: arguments, running the load generator against a setup at a list
of rates, the machine description, the experiment JSON, and markdown tables.

Experiment JSON (``baton.bench.experiment/1``)::

    {"schema": "baton.bench.experiment/1", "experiment": NAME, "command": "python -m ...",
     "machine": {...}, "params": {...}, "results": {...experiment-specific...},
     "setups": {SETUP: {"setup": {name, overrides, static_batch_size}, "startup_s": float,
                        "runs": [baton.bench.serve/1 report, ...]}},
     "table": "markdown"}
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from baton.perf.loadgen.arrivals import Burst
from baton.perf.loadgen.report import run_report, write_json
from baton.perf.loadgen.runner import RunConfig, run_load_sync
from baton.perf.loadgen.workload import WorkloadSpec, load_workload
from bench.experiments.cpu_usage import CpuMeter
from bench.experiments.server import ExperimentServer, ServerSetup

SCHEMA = "baton.bench.experiment/1"


def say(msg: str) -> None:
    print(f"[experiment] {msg}", file=sys.stderr, flush=True)


def base_parser(
    description: str, *, rates: str, duration: float, workload: str, drain: float = 20.0, admission: bool | None = None
) -> argparse.ArgumentParser:
    """``admission``: the default of ``--admission/--no-admission`` (``router.slo_rejection``);
    None: the experiment sets it itself and offers no option."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--json", required=True, metavar="OUT", help="write the experiment report here")
    p.add_argument("--model", default="default", help="default (SmolLM2-135M-Instruct), tiny (smoke tests), a path")
    p.add_argument("--workload", default=workload, help=f"load generator workload (default {workload})")
    p.add_argument("--rates", default=rates, help=f"comma-separated offered rates, req/s (default {rates})")
    p.add_argument(
        "--duration", type=float, default=duration, help=f"seconds of arrivals per rate (default {duration})"
    )
    p.add_argument("--warmup", type=float, default=5.0, help="seconds left out of the statistics at each rate")
    p.add_argument(
        "--drain",
        type=float,
        default=drain,
        help="seconds to wait for in-flight requests after the last arrival (the rest count as timeouts)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--plots", default=None, metavar="DIR", help="PNG plots (default: OUT's name + '_plots')")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument(
        "--speed-probe",
        default=None,
        metavar="COST_MODEL",
        help="time a few fixed steps before each run and after the last (baton.perf.profile.speed) "
        "against this cost model, so the simulator can replay each run on the machine it had",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra config override for every setup, e.g. engine.max_num_seqs=64 (YAML value)",
    )
    if admission is not None:
        p.add_argument(
            "--admission",
            action=argparse.BooleanOptionalAction,
            default=admission,
            help="SLO-predictive early rejection in the router (router.slo_rejection; "
            f"default here: {'on' if admission else 'off'})",
        )
    return p


def parse_rates(text: str) -> list[float]:
    try:
        rates = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"--rates must be comma-separated numbers, got {text!r}") from None
    if not rates or any(r <= 0 for r in rates):
        raise SystemExit(f"--rates must be positive numbers, got {text!r}")
    return rates


def common_overrides(args: argparse.Namespace) -> dict[str, Any]:
    import yaml

    out: dict[str, Any] = {"model.path": args.model}
    if getattr(args, "admission", None) is not None:
        out["router.slo_rejection"] = args.admission
    for item in args.set:
        key, eq, value = item.partition("=")
        if not eq:
            raise SystemExit(f"--set must be KEY=VALUE, got {item!r}")
        out[key.strip()] = yaml.safe_load(value)
    return out


def machine() -> dict[str, Any]:
    from engine.cpu_info import cpuinfo_field

    cpu = cpuinfo_field("model name") or platform.processor() or ""
    mem = None
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError, AttributeError):
        pass
    return {
        "cpus": os.cpu_count(),
        "cpu": cpu,
        "memory_gib": None if mem is None else round(mem, 1),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "hostname": platform.node(),
        "load_avg_at_start": os.getloadavg() if hasattr(os, "getloadavg") else None,
    }


@dataclass
class SetupRuns:
    setup: ServerSetup
    startup_s: float | None = None
    reports: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"setup": self.setup.describe(), "startup_s": self.startup_s, "runs": self.reports}


def probe_speed(cost_model: str, model: str) -> dict[str, Any] | None:
    """A ``baton.perf.profile.speed`` probe in a fresh interpreter (a worker's one torch thread), or None
    if it failed: a missing probe costs the replay its calibration, not the experiment."""
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "speed.json"
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "baton.perf.profile.speed",
                "--cost-model",
                cost_model,
                "--model",
                model,
                "--json",
                str(out),
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
        if r.returncode != 0 or not out.exists():
            last_line = (r.stderr.strip().splitlines() or [f"exit status {r.returncode}"])[-1]
            say(f"speed probe failed: {last_line}")
            return None
        probe = json.loads(out.read_text())
    say(f"speed probe: decode steps {probe['decode']:.2f}x, prefill steps {probe['prefill']:.2f}x the cost model's")
    return probe


def run_setup(
    setup: ServerSetup,
    spec: WorkloadSpec,
    rates: list[float],
    args: argparse.Namespace,
    *,
    burst: Burst | None = None,
    slos: dict | None = None,
    after_run: Callable[[dict[str, Any]], None] | None = None,
) -> SetupRuns:
    """Start ``setup``'s cluster, drive it at each rate in turn (open loop, over HTTP), stop it."""
    out = SetupRuns(setup)
    server = ExperimentServer(setup)
    cost_model = getattr(args, "speed_probe", None)
    if cost_model and not Path(cost_model).is_file():
        raise SystemExit(f"--speed-probe: no cost-model file at {cost_model}")
    with server as ep:
        out.startup_s = server.startup_s
        before = probe_speed(cost_model, args.model) if cost_model else None
        for rate in rates:
            say(f"{setup.name}: {rate:g} req/s for {args.duration:g} s ({spec.name})")
            cfg = RunConfig(
                url=ep.http_url,
                spec=spec,
                duration_s=args.duration,
                rate=rate,
                burst=burst,
                seed=args.seed,
                warmup_s=min(args.warmup, args.duration / 2),
                drain_s=args.drain,
                timeout_s=max(600.0, args.duration + args.drain),
                slos=slos or {},
                progress=not args.no_progress,
            )
            meter = CpuMeter(server.pid) if server.pid is not None and CpuMeter.available() else None
            if meter is not None:
                meter.start()
            result = run_load_sync(cfg)
            report = run_report(result)
            report["setup"] = setup.name
            if meter is not None:  # the whole run: arrivals and drain, all processes of the cluster
                report["cpu"] = meter.stop()
                say(
                    f"{setup.name}: cores used — workers {report['cpu']['workers_cores']:.2f}, "
                    f"router/Ray/Redis/client {report['cpu']['host_cores']:.2f}"
                )
            if cost_model:  # the probe after this run is the one before the next
                after = probe_speed(cost_model, args.model)
                report["speed"] = {"before": before, "after": after}
                before = after
            out.reports.append(report)
            if after_run is not None:
                after_run(report)
    return out


def workload(args: argparse.Namespace) -> WorkloadSpec:
    return load_workload(args.workload)


def fmt_ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:,.0f}"


def fmt_pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    align = ["---"] + ["---:"] * (len(header) - 1)
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(align) + " |"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def write_experiment(
    name: str,
    args: argparse.Namespace,
    params: dict[str, Any],
    setups: list[SetupRuns],
    results: dict[str, Any],
    table: str,
) -> Path:
    doc = {
        "schema": SCHEMA,
        "experiment": name,
        "command": "python -m bench.experiments." + name + " " + " ".join(sys.argv[1:]),
        "created_unix": round(time.time(), 3),
        "machine": machine(),
        "params": params,
        "results": results,
        "setups": {s.setup.name: s.to_dict() for s in setups},
        "table": table,
    }
    path = write_json(doc, args.json)
    say(f"report: {path}")
    return path


def plots_dir(args: argparse.Namespace) -> Path:
    return Path(args.plots) if args.plots else Path(str(Path(args.json).with_suffix("")) + "_plots")


def write_rate_plots(setups: list[SetupRuns], out_dir: Path) -> None:
    """Latency vs rate per setup and the CDF/time series of each setup's highest rate."""
    from baton.perf.loadgen.plots import PlotsUnavailable, plot_latency_vs_rate, points_from_reports, write_plots

    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        for s in setups:
            if len(s.reports) >= 2:
                plot_latency_vs_rate(
                    points_from_reports(s.reports),
                    out_dir / f"{s.setup.name}_latency_vs_rate.png",
                    title=f"{s.setup.name}: latency vs offered rate",
                )
            if s.reports:
                for p in write_plots(s.reports[-1], out_dir / f"{s.setup.name}_highest_rate"):
                    say(f"plot: {p}")
    except PlotsUnavailable as e:
        say(f"no plots: {e}")


def dump(obj: Any) -> str:
    return json.dumps(obj, indent=1)


def rate_rows(setups: list[SetupRuns], lane: str | None = None) -> list[list[str]]:
    """One row per (setup, rate): throughput, latency percentiles, SLO attainment, goodput."""
    rows = []
    for s in setups:
        for r in s.reports:
            st = r["summary"] if lane is None else r["lanes"].get(lane)
            if st is None:
                continue
            rows.append(
                [
                    s.setup.name,
                    f"{r['config']['rate']:g}",
                    f"{st['request_throughput']:.2f}",
                    f"{st['output_token_throughput']:.1f}",
                    f"{fmt_ms(st['ttft_s']['p50'])} / {fmt_ms(st['ttft_s']['p99'])}",
                    f"{fmt_ms(st['tpot_s']['p50'])} / {fmt_ms(st['tpot_s']['p99'])}",
                    fmt_ms(st["itl_s"]["p99"]),
                    f"{fmt_ms(st['e2e_s']['p50'])} / {fmt_ms(st['e2e_s']['p99'])}",
                    fmt_pct(st["slo_attainment"]),
                    f"{st['goodput_rps']:.2f}",
                    f"{st['rejected'] + st['errors']}",
                ]
            )
    return rows


RATE_HEADER = [
    "setup",
    "offered req/s",
    "done req/s",
    "output tok/s",
    "TTFT p50 / p99 ms",
    "TPOT p50 / p99 ms",
    "ITL p99 ms",
    "e2e p50 / p99 ms",
    "SLO met",
    "goodput req/s",
    "rejected+failed",
]


def summaries(setups: list[SetupRuns], lane: str | None = None) -> dict[str, list[dict[str, Any]]]:
    """setup -> [{rate, stats}] for the experiment's ``results``."""
    return {
        s.setup.name: [
            {"rate": r["config"]["rate"], "stats": r["summary"] if lane is None else r["lanes"].get(lane)}
            for r in s.reports
        ]
        for s in setups
    }
