"""Simulated vs measured: replay a measured experiment through the simulator and compare.

    python -m baton.perf.sim.validate --cost-model cost_model.json --experiment results/exp2.json [--json OUT]

For every setup and rate of a ``baton.bench.experiment/1`` report (``bench/experiments/*``), the
simulator runs the same cluster (the setup's config overrides on ``baton/default_config.yaml``),
the same workload, rate, seed, duration, warmup and drain, and the table puts its TTFT, ITL and
TPOT percentiles next to the measured ones with the relative error. ``--tolerance`` (default 20%)
marks each p50/p90 TTFT and ITL as within it or not; the exit status is 0 when all are.

``--repeat OTHER`` puts a second measured run of the same experiment next to it: how far apart two
measurements of one setup and rate are is the floor under any simulator's error (near a worker's
saturation, two runs of the same command can differ more than the tolerance).

Runs measured with ``--speed-probe`` carry the machine's speed before and after them
(``baton.perf.profile.speed``: decode and prefill step time / the cost model's); each is replayed on that
machine (the mean of its two probes scales decode and prefill steps). ``--no-speed`` ignores them.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
from dataclasses import replace
from pathlib import Path

METRICS = ("ttft_s", "itl_s", "tpot_s")
CHECKED = (("ttft_s", "p50"), ("ttft_s", "p90"), ("itl_s", "p50"), ("itl_s", "p90"))
EXPERIMENT_DEFAULT_DRAIN_S = 20.0  # bench.experiments.common.base_parser's


def _drain_of(command: str) -> float:
    args = shlex.split(command or "")
    for i, a in enumerate(args):
        if a == "--drain" and i + 1 < len(args):
            return float(args[i + 1])
        if a.startswith("--drain="):
            return float(a.split("=", 1)[1])
    return EXPERIMENT_DEFAULT_DRAIN_S


def _rel(pred: float | None, meas: float | None) -> float | None:
    return None if pred is None or not meas else (pred - meas) / meas


def run_speed(report: dict, cost):
    """The mean of the speed probes around a run (None when it has none)."""
    from baton.perf.profile.speed import SpeedProbe, mean_probe

    sp = report.get("speed") or {}
    speed = mean_probe([SpeedProbe.from_json(p) for p in (sp.get("before"), sp.get("after")) if p])
    if speed is not None and speed.reference != cost.created:
        raise ValueError(
            f"the run's speed probes compare with the cost model created {speed.reference!r}, not this "
            f"one ({cost.created!r}): pass that cost model, or --no-speed"
        )
    return speed


def compare(
    cost,
    experiment: dict,
    *,
    step_scale: float = 1.0,
    tolerance: float = 0.2,
    band: float = 0.05,
    use_speed: bool = True,
    progress=lambda m: None,
) -> list[dict]:
    """One row per (setup, rate). ``band``: also simulate with every step ``band`` faster and slower
    (and half that), and report each statistic's range: with a few dozen requests, percentiles
    can jump between the modes of a bimodal distribution (e.g. ITL between one- and two-sequence
    decode steps) on a few percent of step time, and the range shows when that happens."""
    from baton.config import load_config
    from baton.perf.loadgen.arrivals import Burst
    from baton.perf.loadgen.slo import LaneSLO
    from baton.perf.loadgen.workload import workload_from_dict
    from baton.perf.sim.cli import sim_requests
    from baton.perf.sim.config import sim_config_from_baton
    from baton.perf.sim.simulator import Simulation

    if experiment.get("schema") != "baton.bench.experiment/1":
        raise ValueError(
            f"not an experiment report (schema {experiment.get('schema')!r}, expected 'baton.bench.experiment/1')"
        )
    drain = _drain_of(experiment.get("command", ""))
    rows = []
    for name, setup in experiment["setups"].items():
        overrides = dict(setup["setup"].get("overrides") or {})
        if setup["setup"].get("static_batch_size"):
            raise ValueError(f"setup {name}: static batching is not simulated")
        cfg = replace(sim_config_from_baton(load_config(None, overrides), cost), step_scale=step_scale)
        for report in setup["runs"]:
            c = report["config"]
            if c.get("mode") != "open":
                raise ValueError(f"setup {name}: only open-loop runs (a rate) can be replayed")
            spec = workload_from_dict(c["workload"], c["workload"].get("name", "custom"))
            burst = Burst(**c["burst"]) if c.get("burst") else None
            reqs = sim_requests(spec, c["rate"], c["duration_s"], c["seed"], cost.model.max_model_len, burst)
            slos = {lane: LaneSLO(**s) for lane, s in (c.get("slos") or {}).items()}
            speed = run_speed(report, cost) if use_speed else None
            decode_scale = step_scale * (speed.decode if speed else 1.0)
            prefill_scale = step_scale * (speed.prefill if speed else 1.0)

            def simulate(scale: float) -> dict:
                run_cfg = replace(cfg, step_scale=decode_scale * scale, prefill_step_scale=prefill_scale * scale)
                res = Simulation(cost, run_cfg, seed=c["seed"]).run(
                    reqs,
                    duration_s=c["duration_s"],
                    rate=c["rate"],
                    drain_s=drain,
                    warmup_s=c["warmup_s"],
                    lanes=list(spec.lanes),
                    slo=slos or None,
                )
                return res.summary["summary"]

            pred, meas = simulate(1.0), report["summary"]
            spread = [pred] + [simulate(1.0 + k * band) for k in (-1, -0.5, 0.5, 1)] if band else [pred]
            row = {
                "setup": name,
                "rate": c["rate"],
                "label": cfg.label(),
                "measured": {m: meas[m] for m in METRICS},
                "predicted": {m: pred[m] for m in METRICS},
                "goodput": {"measured": meas.get("goodput_rps"), "predicted": pred.get("goodput_rps")},
                "errors": {},
                "speed": None if speed is None else {"decode": speed.decode, "prefill": speed.prefill},
            }
            row["range"] = {}
            for m, q in CHECKED:
                row["errors"][f"{m}.{q}"] = _rel(pred[m][q], meas[m][q])
                vals = [x[m][q] for x in spread if x[m][q] is not None]
                row["range"][f"{m}.{q}"] = [min(vals), max(vals)] if vals else None
            row["within"] = all(e is not None and abs(e) <= tolerance for e in row["errors"].values())
            rows.append(row)
            progress(
                f"{name} at {c['rate']:g} req/s"
                + (f" (speed: decode {speed.decode:.2f}x, prefill {speed.prefill:.2f}x)" if speed else "")
                + ": "
                + ", ".join(f"{k} {'-' if v is None else f'{v:+.0%}'}" for k, v in row["errors"].items())
            )
    return rows


def repeat_errors(experiment: dict, repeat: dict) -> dict[tuple[str, float], dict[str, float | None]]:
    """(setup, rate) -> the repeat's relative difference from the experiment, per checked statistic."""
    out = {}
    for name, setup in experiment["setups"].items():
        other = {r["config"]["rate"]: r for r in (repeat.get("setups") or {}).get(name, {}).get("runs", [])}
        for run in setup["runs"]:
            rate = run["config"]["rate"]
            if rate in other:
                out[(name, rate)] = {
                    f"{m}.{q}": _rel(other[rate]["summary"][m][q], run["summary"][m][q]) for m, q in CHECKED
                }
    return out


def format_repeat(rows: list[dict]) -> str:
    out = [
        "| setup | req/s | TTFT p50 / p90: repeat vs measured | ITL p50 / p90: repeat vs measured |",
        "|---|---:|---:|---:|",
    ]
    pct = lambda e: "-" if e is None else f"{e:+.0%}"  # noqa: E731
    for r in rows:
        e = r.get("repeat")
        if e:
            out.append(
                f"| {r['setup']} | {r['rate']:g} | {pct(e['ttft_s.p50'])} / {pct(e['ttft_s.p90'])} "
                f"| {pct(e['itl_s.p50'])} / {pct(e['itl_s.p90'])} |"
            )
    return "\n".join(out) if len(out) > 2 else ""


def format_rows(rows: list[dict], tolerance: float) -> str:
    def ms(v):
        return "-" if v is None else f"{v * 1e3:.0f}"

    out = [
        "| setup | req/s | metric | measured p50/p90/p99 ms | simulated p50/p90/p99 ms | error p50 | error p90 |",
        "|---|---:|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        for m in METRICS:
            a, b = r["measured"][m], r["predicted"][m]
            e50, e90 = _rel(b["p50"], a["p50"]), _rel(b["p90"], a["p90"])

            def fmt(e: float | None) -> str:  # TPOT is shown, not checked
                return "-" if e is None else f"{e:+.0%}" + ("" if abs(e) <= tolerance or m == "tpot_s" else " !")

            trio = lambda d: f"{ms(d['p50'])}/{ms(d['p90'])}/{ms(d['p99'])}"  # noqa: E731
            out.append(
                f"| {r['setup']} | {r['rate']:g} | {m[:-2].upper()} | {trio(a)} | {trio(b)} | {fmt(e50)} | {fmt(e90)} |"
            )
    ok = sum(r["within"] for r in rows)
    out.append(
        f"\n{ok} of {len(rows)} runs have p50 and p90 TTFT and ITL within {tolerance:.0%} of the measured values"
        " (! marks the misses)"
    )
    if any(r.get("range") for r in rows):
        out.append("\nsimulated range with every step time changed by up to the band (p50/p90, ms):")
        for r in rows:
            parts = []
            for key, rng in r["range"].items():
                if rng:
                    meas = r["measured"][key.split(".")[0]][key.split(".")[1]]
                    inside = meas is not None and rng[0] <= meas <= rng[1]
                    parts.append(
                        f"{key.replace('_s.', ' ')} {rng[0] * 1e3:.0f}-{rng[1] * 1e3:.0f}"
                        f"{' (measured inside)' if inside else ''}"
                    )
            out.append(f"  {r['setup']} {r['rate']:g} req/s: " + "; ".join(parts))
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    from baton.perf.profile.cost_model import CostModel
    from baton.perf.sim.cli import check_output_file

    p = argparse.ArgumentParser(prog="python -m baton.perf.sim.validate", description=__doc__.split("\n\n")[0])
    p.add_argument("--cost-model", required=True, metavar="FILE")
    p.add_argument("--experiment", required=True, metavar="FILE", help="a baton.bench.experiment/1 report")
    p.add_argument("--step-scale", type=float, default=1.0, help="multiply every predicted step time")
    p.add_argument("--tolerance", type=float, default=0.2)
    p.add_argument(
        "--band",
        type=float,
        default=0.05,
        help="also simulate with step times this much faster/slower and show the range (0: off)",
    )
    p.add_argument(
        "--repeat",
        default=None,
        metavar="FILE",
        help="a second measured run of the same experiment: its difference is the noise floor",
    )
    p.add_argument(
        "--no-speed",
        action="store_true",
        help="ignore the runs' speed probes (replay every run on the profiled machine)",
    )
    p.add_argument("--json", default=None, metavar="OUT")
    args = p.parse_args(argv)
    try:
        # Before the simulations (minutes with --band), not after them.
        if not (math.isfinite(args.step_scale) and args.step_scale > 0):
            raise ValueError(f"--step-scale must be a finite number > 0, got {args.step_scale:g}")
        if not (math.isfinite(args.tolerance) and args.tolerance >= 0):
            raise ValueError(f"--tolerance must be a finite number >= 0, got {args.tolerance:g}")
        if not (0 <= args.band < 1):
            raise ValueError(f"--band must be in [0, 1), got {args.band:g}")
        if args.json:
            check_output_file("--json", args.json)
        cost = CostModel.load(args.cost_model)
        try:
            experiment = json.loads(Path(args.experiment).read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ValueError(f"cannot read {args.experiment}: {e}") from None
        rows = compare(
            cost,
            experiment,
            step_scale=args.step_scale,
            tolerance=args.tolerance,
            band=args.band,
            use_speed=not args.no_speed,
            progress=lambda m: print(f"[validate] {m}", file=sys.stderr, flush=True),
        )
        if args.repeat:
            try:
                repeat = json.loads(Path(args.repeat).read_text())
            except (OSError, json.JSONDecodeError) as e:
                raise ValueError(f"cannot read {args.repeat}: {e}") from None
            diffs = repeat_errors(experiment, repeat)
            for r in rows:
                r["repeat"] = diffs.get((r["setup"], r["rate"]))
    except (ValueError, KeyError) as e:
        print(f"python -m baton.perf.sim.validate: error: {e}", file=sys.stderr)
        return 2
    print(format_rows(rows, args.tolerance))
    if args.repeat:
        print(f"\ntwo measurements of the same runs ({args.repeat} vs {args.experiment}):\n" + format_repeat(rows))
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "schema": "baton.sim.validate/1",
                    "cost_model": args.cost_model,
                    "experiment": args.experiment,
                    "repeat": args.repeat,
                    "tolerance": args.tolerance,
                    "rows": rows,
                },
                indent=1,
            )
            + "\n"
        )
    return 0 if rows and all(r["within"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
