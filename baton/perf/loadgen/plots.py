"""PNG plots of ``baton.bench.serve/1`` reports (matplotlib, optional).

- ``latency_vs_rate.png``: TTFT and TPOT (p50, p99) and SLO attainment against the offered rate,
  per lane, from a ``--search`` report or from several runs (``points_from_reports``);
- ``latency_cdf.png``: CDFs of TTFT, TPOT and e2e latency per lane;
- ``timeseries.png``: router queue depth by lane, client in-flight requests, KV usage by worker,
  with the burst window shaded.

matplotlib is an optional dependency (``pip install 'baton[bench]'``); without it the functions
raise ``PlotsUnavailable`` with that instruction, and callers report it and carry on.

Usage on saved reports: ``python -m baton.perf.loadgen.plots OUT_DIR REPORT.json [REPORT.json ...]``.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any


class PlotsUnavailable(RuntimeError):
    pass


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only: never needs a display
        import matplotlib.pyplot as plt
    except ImportError:
        raise PlotsUnavailable(
            "plots need matplotlib, which is not installed: pip install 'baton[bench]' "
            "(or pip install 'matplotlib>=3.8,<4')"
        ) from None
    return plt


def _plain_format(value: float, _pos: object = None) -> str:
    """Log-axis tick labels as plain numbers (matplotlib's default is 10^x notation)."""
    return f"{value:g}"


def _minor_format(value: float, _pos: object = None) -> str:
    """Minor log ticks: label only 2x and 5x a power of ten, so labels never collide."""
    if value <= 0:
        return ""
    mantissa = round(value / 10 ** math.floor(math.log10(value)))
    return f"{value:g}" if mantissa in (2, 5) else ""


def _plain(minor: bool = False):
    from matplotlib.ticker import FuncFormatter

    return FuncFormatter(_minor_format if minor else _plain_format)


def _auto_log(ax, axis: str) -> None:
    """A log scale with plain labels when the plotted values span more than 20x; linear otherwise
    (a log axis over a narrow range shows no labelled tick at all)."""
    values = [
        v
        for line in ax.get_lines()
        for v in (line.get_xdata() if axis == "x" else line.get_ydata())
        if isinstance(v, (int, float)) and v > 0 and not math.isnan(v)
    ]
    if not values or max(values) / min(values) <= 20:
        return
    getattr(ax, f"set_{axis}scale")("log")
    target = ax.xaxis if axis == "x" else ax.yaxis
    target.set_major_formatter(_plain())
    target.set_minor_formatter(_plain(minor=True))


def points_from_reports(reports: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Latency-vs-rate points from several single-rate reports (sorted by rate)."""
    points = []
    for r in reports:
        rate = r["config"].get("rate") or r["summary"].get("request_throughput")
        points.append(
            {
                "rate": rate,
                "attainment": r["summary"].get("slo_attainment"),
                "summary": r["summary"],
                "lanes": r["lanes"],
            }
        )
    return sorted(points, key=lambda p: p["rate"])


def plot_latency_vs_rate(points: Sequence[dict[str, Any]], path: str | Path, title: str = "") -> Path:
    plt = _pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    lanes = sorted({lane for p in points for lane in p["lanes"]})
    rates = [p["rate"] for p in points]
    for lane in lanes:
        for ax, key in ((axes[0], "ttft_s"), (axes[1], "tpot_s")):
            for q, style in (("p50", "-o"), ("p99", "--s")):
                ys = [(p["lanes"].get(lane) or {}).get(key, {}).get(q) for p in points]
                xs = [x for x, y in zip(rates, ys) if y is not None]
                ax.plot(xs, [y * 1e3 for y in ys if y is not None], style, label=f"{lane} {q}")
        att = [(p["lanes"].get(lane) or {}).get("slo_attainment") for p in points]
        axes[2].plot(
            [x for x, a in zip(rates, att) if a is not None], [a * 100 for a in att if a is not None], "-o", label=lane
        )
    axes[2].axhline(90, color="gray", linestyle=":", label="90% target")
    for ax, ylabel in zip(axes, ("TTFT (ms)", "TPOT (ms)", "requests meeting both SLOs (%)")):
        ax.set_xlabel("offered rate (req/s)")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    _auto_log(axes[0], "y")
    _auto_log(axes[1], "y")
    axes[2].set_ylim(0, 105)
    fig.suptitle(title or "latency vs offered rate")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


def _cdf(ax, values: list[float], label: str) -> None:
    if not values:
        return
    xs = sorted(values)
    ax.plot([x * 1e3 for x in xs], [(i + 1) / len(xs) for i in range(len(xs))], label=f"{label} (n={len(xs)})")


def plot_latency_cdf(report: dict[str, Any], path: str | Path) -> Path:
    plt = _pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    ok = [r for r in report["requests"] if r["status"] == "ok"]
    for lane in sorted({r["lane"] for r in ok}):
        mine = [r for r in ok if r["lane"] == lane]
        for ax, key in zip(axes, ("ttft_s", "tpot_s", "e2e_s")):
            _cdf(ax, [r[key] for r in mine if r[key] is not None], lane)
    slos = report["config"].get("slos", {})
    for ax, key, name in zip(axes, ("ttft_s", "tpot_s", "e2e_s"), ("TTFT", "TPOT", "e2e latency")):
        if key in ("ttft_s", "tpot_s"):
            for lane, slo in slos.items():
                if any(r["lane"] == lane for r in ok) and slo[key] * 1e3 < ax.get_xlim()[1] * 4:
                    ax.axvline(slo[key] * 1e3, linestyle=":", color="gray")
        ax.set_xlabel(f"{name} (ms)")
        ax.set_ylabel("fraction of requests")
        _auto_log(ax, "x")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.suptitle("latency CDF (dotted: lane SLOs)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


def plot_timeseries(report: dict[str, Any], path: str | Path) -> Path:
    plt = _pyplot()
    ts = report["timeseries"]
    fig, axes = plt.subplots(3, 1, figsize=(11, 9.5), sharex=True)
    t = [s["t"] for s in ts]
    nan = float("nan")
    lanes = sorted({lane for s in ts for lane in s["waiting"]})
    for lane in lanes:
        axes[0].plot(t, [s["waiting"].get(lane, nan) for s in ts], label=f"router queue: {lane}")
    axes[0].plot(t, [s["in_flight"] for s in ts], "k--", linewidth=1, label="client in flight")
    axes[0].set_ylabel("requests")
    workers = sorted({w for s in ts for w in s["kv_usage"]} | {w for s in ts for w in s["worker_waiting"]})
    for w in workers:
        axes[1].plot(t, [s["worker_waiting"].get(w, nan) for s in ts], label=f"{w} waiting")
        axes[1].plot(t, [s["worker_running"].get(w, nan) for s in ts], ":", label=f"{w} running")
        axes[2].plot(t, [s["kv_usage"].get(w, nan) * 100 for s in ts], label=w)
    axes[1].set_ylabel("requests in the worker")
    axes[2].set_ylabel("KV cache usage (%)")
    axes[2].set_xlabel("time since start (s)")
    burst = report["config"].get("burst")
    for ax in axes:
        if burst:
            ax.axvspan(burst["start_s"], burst["start_s"] + burst["length_s"], color="orange", alpha=0.15)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8, loc="upper right")
    fig.suptitle("queue depth and KV usage over time" + (" (shaded: burst)" if burst else ""))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


def write_plots(report: dict[str, Any], out_dir: str | Path, extra_points: Sequence[dict[str, Any]] = ()) -> list[Path]:
    """Every plot a report supports, into ``out_dir``. Latency vs rate needs a search or
    ``extra_points`` (several runs); the others need requests / a time series."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    points = list(extra_points) or ((report.get("search") or {}).get("points") or [])
    if len(points) >= 2:
        written.append(plot_latency_vs_rate(points, out / "latency_vs_rate.png"))
    if report.get("requests"):
        written.append(plot_latency_cdf(report, out / "latency_cdf.png"))
    if report.get("timeseries"):
        written.append(plot_timeseries(report, out / "timeseries.png"))
    return written


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) < 2:
        print("usage: python -m baton.perf.loadgen.plots OUT_DIR REPORT.json [REPORT.json ...]", file=sys.stderr)
        return 2
    reports = [json.loads(Path(p).read_text()) for p in args[1:]]
    try:
        paths = write_plots(reports[-1], args[0], points_from_reports(reports) if len(reports) > 1 else ())
    except PlotsUnavailable as e:
        print(f"bench: {e}", file=sys.stderr)
        return 1
    for p in paths:
        print(p)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
