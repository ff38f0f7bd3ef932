"""Kept for users and re-runs of docs/BENCHMARKS.md's experiment (3): how the lanes absorb a burst.

Experiment 3: a 2x burst for 10 s on an interactive + batch mix.

One cluster (the default config: 1 prefill + 1 decode worker, default lanes), the ``mixed``
workload (70% interactive chat turns, 30% batch jobs with longer prompts and answers) at a steady
open-loop rate, with the rate doubled for ``--burst-length`` seconds from ``--burst-start``.
Reported:

- interactive TTFT (p50, p99) for requests arriving before, during and after the burst: does the
  interactive lane keep its SLO while the burst lasts?
- the batch lane: its TTFT in the same windows and the peak depth of its router queue: the batch
  lane is where the excess is meant to wait (weighted fair dispatch, weight 8:1, batch preemptible);
- the time to drain back to steady state after the burst ends: until the client's in-flight count
  (and, when ``/metrics`` is scraped, the router's total queue depth) is back to its pre-burst
  level (p90 over the steady window before the burst) and stays there for ``HOLD_S`` seconds.

``--lane-priority-baseline`` runs the same load a second time with ``router.lane_priority: false``
(the decode workers do not share their slots by lane nor preempt batch for the interactive pace),
the same-run baseline of issue 50's policy.

    python -m bench.experiments.burst --json results/exp3.json
    python -m bench.experiments.burst --json /tmp/exp3.json --model tiny --rates 3 --duration 30 \\
        --burst-start 10 --burst-length 5
"""

from __future__ import annotations

import sys
from typing import Any

from baton.perf.loadgen.arrivals import Burst
from baton.perf.loadgen.stats import percentile
from bench.experiments.common import (
    base_parser,
    common_overrides,
    fmt_ms,
    fmt_pct,
    markdown_table,
    parse_rates,
    plots_dir,
    run_setup,
    say,
    workload,
    write_experiment,
)
from bench.experiments.server import ServerSetup

NAME = "burst"
HOLD_S = 2.0  # a queue must stay back at its steady level this long to count as drained


def _ttft(requests: list[dict], lane: str, t0: float, t1: float) -> dict[str, Any]:
    """TTFT percentiles of ``lane``'s requests arriving in [t0, t1); failures are counted, not timed."""
    mine = [r for r in requests if r["lane"] == lane and t0 <= r["arrival_s"] < t1]
    ttft = [r["ttft_s"] for r in mine if r["status"] == "ok" and r["ttft_s"] is not None]
    return {
        "requests": len(mine),
        "ok": len(ttft),
        "p50": percentile(ttft, 50),
        "p99": percentile(ttft, 99),
        "not_ok": len(mine) - len(ttft),
    }


def _drain_time(ts: list[dict], key, steady: tuple[float, float], burst_end: float) -> dict[str, Any]:
    """Seconds from the burst's end until ``key(sample)`` is back to its steady level for HOLD_S."""
    values = [key(s) for s in ts if steady[0] <= s["t"] < steady[1] and key(s) is not None]
    if not values:
        return {"steady_level": None, "peak": None, "drain_s": None}
    level = max(
        percentile(values, 90) or 0.0, 1.0
    )  # one request in flight is steady, not a backlog (values: not empty)
    after = [s for s in ts if s["t"] >= burst_end and key(s) is not None]
    peak = max((key(s) for s in ts if s["t"] >= steady[1] and key(s) is not None), default=None)
    for i, s in enumerate(after):
        window = [x for x in after[i:] if x["t"] <= s["t"] + HOLD_S]
        observed = after[-1]["t"] >= s["t"] + HOLD_S  # the run lasted long enough to see it hold
        if observed and all(key(x) <= level for x in window):
            return {"steady_level": level, "peak": peak, "drain_s": round(s["t"] - burst_end, 3)}
    return {"steady_level": level, "peak": peak, "drain_s": None}  # not drained before the run ended


def analyze_burst(report: dict[str, Any]) -> dict[str, Any]:
    """Windowed latencies and drain times of one ``baton.bench.serve/1`` report with a burst."""
    cfg = report["config"]
    b = cfg["burst"]
    start, end = b["start_s"], b["start_s"] + b["length_s"]
    w0, w1 = cfg["warmup_s"], cfg["duration_s"]
    reqs, ts = report["requests"], report["timeseries"]
    windows = {"before": (w0, start), "during": (start, end), "after": (end, w1)}
    out: dict[str, Any] = {"burst": b, "windows": {k: list(v) for k, v in windows.items()}, "lanes": {}}
    for lane in sorted({r["lane"] for r in reqs}):
        out["lanes"][lane] = {name: _ttft(reqs, lane, *win) for name, win in windows.items()}
    scraped = [s for s in ts if s.get("scraped")]
    out["drain"] = {"client_in_flight": _drain_time(ts, lambda s: s["in_flight"], (w0, start), end)}
    if scraped:
        out["drain"]["router_queue"] = _drain_time(scraped, lambda s: sum(s["waiting"].values()), (w0, start), end)
        for lane in sorted({lane for s in scraped for lane in s["waiting"]}):
            out["drain"][f"router_queue:{lane}"] = _drain_time(
                scraped, lambda s, name=lane: s["waiting"].get(name), (w0, start), end
            )
    return out


def burst_table(setup: str, rate: float, a: dict[str, Any], slo_attainment: dict[str, float | None]) -> str:
    rows = []
    for lane, wins in a["lanes"].items():
        row = [setup, f"{rate:g}", lane]
        for name in ("before", "during", "after"):
            w = wins[name]
            row.append(
                f"{fmt_ms(w['p50'])} / {fmt_ms(w['p99'])}"
                + (f" ({w['not_ok']} rejected/failed)" if w["not_ok"] else "")
            )
        row.append(fmt_pct(slo_attainment.get(lane)))
        q = a["drain"].get(f"router_queue:{lane}")
        row.append("-" if q is None or q["peak"] is None else f"{q['peak']:g}")
        rows.append(row)
    table = markdown_table(
        [
            "setup",
            "base req/s",
            "lane",
            "TTFT p50 / p99 ms before",
            "during burst",
            "after",
            "SLO met (run)",
            "peak router queue",
        ],
        rows,
    )
    drains = []
    for what, d in a["drain"].items():
        if ":" in what:
            continue
        drains.append(
            f"{what}: steady <= {d['steady_level']:g}, peak {d['peak']:g}, back "
            + ("never (within the run)" if d["drain_s"] is None else f"{d['drain_s']:.1f} s after the burst")
            if d["steady_level"] is not None
            else f"{what}: no samples"
        )
    return table + "\n\ndrain to steady state: " + "; ".join(drains)


def main(argv: list[str] | None = None) -> int:
    p = base_parser(__doc__.split("\n\n")[0], rates="0.25", duration=90.0, workload="mixed", drain=60.0, admission=True)
    p.add_argument("--burst-factor", type=float, default=2.0)
    p.add_argument("--burst-start", type=float, default=30.0)
    p.add_argument("--burst-length", type=float, default=10.0)
    p.add_argument(
        "--lane-priority-baseline",
        action="store_true",
        help="also run with router.lane_priority off (the baseline), in the same run",
    )
    p.set_defaults(warmup=10.0)
    args = p.parse_args(argv)
    rates = parse_rates(args.rates)
    burst = Burst(args.burst_factor, args.burst_start, args.burst_length)
    if not args.warmup < burst.start_s < burst.start_s + burst.length_s < args.duration:
        raise SystemExit("need warmup < burst start < burst end < duration")
    spec = workload(args)
    setups = [ServerSetup("default", common_overrides(args))]
    if args.lane_priority_baseline:
        setups.append(ServerSetup("lane_priority_off", {**common_overrides(args), "router.lane_priority": False}))
    all_runs = [run_setup(setup, spec, rates, args, burst=burst) for setup in setups]
    analyses, tables = [], []
    for runs in all_runs:
        for report in runs.reports:
            a = analyze_burst(report)
            analyses.append({"setup": runs.setup.name, "rate": report["config"]["rate"], **a})
            tables.append(
                burst_table(
                    runs.setup.name,
                    report["config"]["rate"],
                    a,
                    {lane: s["slo_attainment"] for lane, s in report["lanes"].items()},
                )
            )
    table = "\n\n".join(tables)
    write_experiment(
        NAME,
        args,
        {
            "rates": rates,
            "duration_s": args.duration,
            "workload": spec.to_dict(),
            "model": args.model,
            "burst": analyses[0]["burst"] if analyses else None,
        },
        all_runs,
        {"analyses": analyses},
        table,
    )
    try:
        from baton.perf.loadgen.plots import PlotsUnavailable, write_plots

        for runs in all_runs:
            suffix = "" if runs.setup.name == "default" else f"_{runs.setup.name}"
            for report in runs.reports:
                for path in write_plots(report, plots_dir(args) / f"rate_{report['config']['rate']:g}{suffix}"):
                    say(f"plot: {path}")
    except PlotsUnavailable as e:
        say(f"no plots: {e}")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
