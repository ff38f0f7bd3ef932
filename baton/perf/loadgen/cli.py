"""``baton bench serve``: arguments, one run or a goodput search, the report, plots.

Only argparse is imported at module level so ``baton --help`` stays fast; the client stack
(httpx, grpc) loads when a run starts.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", required=True, help="server: http://HOST:PORT (OpenAI HTTP), or HOST:PORT with --grpc")
    p.add_argument("--grpc", action="store_true", help="drive the gRPC API instead of HTTP")
    p.add_argument(
        "--metrics-url",
        default=None,
        help="Prometheus endpoint to sample (default: URL/metrics over HTTP; none with --grpc); '' disables",
    )
    p.add_argument(
        "--workload",
        default="sharegpt",
        help="builtin (sharegpt, fixed, uniform, mixed, shared-prefix) or a YAML/JSON workload file",
    )
    load = p.add_mutually_exclusive_group(required=True)
    load.add_argument("--rate", type=float, help="open loop: requests/s (with --search: the starting rate)")
    load.add_argument("--concurrency", type=int, help="closed loop: this many clients, each one request at a time")
    p.add_argument("--duration", type=float, default=60.0, help="seconds of arrivals per run (default 60)")
    p.add_argument(
        "--warmup", type=float, default=0.0, help="leave requests arriving in the first S seconds out of the statistics"
    )
    p.add_argument(
        "--burst",
        default=None,
        metavar="FACTOR:START:LEN",
        help="multiply the rate by FACTOR from START s for LEN s, e.g. 2:30:10",
    )
    p.add_argument(
        "--lanes",
        default=None,
        metavar="LANE=SHARE,...",
        help="override the workload's lane mix, e.g. interactive=0.7,batch=0.3",
    )
    p.add_argument("--arrival", choices=["poisson", "gamma"], default=None, help="override the arrival process")
    p.add_argument(
        "--gamma-shape",
        type=float,
        default=None,
        help="gamma arrivals (--arrival gamma, or a gamma workload): shape (<1 burstier)",
    )
    p.add_argument(
        "--slo",
        action="append",
        default=[],
        metavar="LANE:ttft=MS,tpot=MS",
        help="override a lane's SLOs (repeatable); defaults follow baton/default_config.yaml",
    )
    p.add_argument(
        "--search",
        action="store_true",
        help="search for the highest rate with >= --search-target of requests meeting both SLOs",
    )
    p.add_argument(
        "--search-target",
        type=float,
        default=None,
        help="share of requests that must meet their SLOs, in (0, 1] (default 0.9)",
    )
    p.add_argument("--search-runs", type=int, default=None, help="runs at most (each --duration long; default 8)")
    p.add_argument(
        "--search-tolerance",
        type=float,
        default=None,
        help="stop when the bracket is this narrow, relative to the failing rate, in (0, 1) (default 0.1)",
    )
    p.add_argument(
        "--search-max-rate",
        type=float,
        default=None,
        help="the highest rate to try, >= --rate (default: as many requests a run as a plan may hold)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=600.0, help="per-request timeout, seconds")
    p.add_argument(
        "--drain",
        type=float,
        default=None,
        help="seconds to wait for in-flight requests after the last arrival (default: --timeout)",
    )
    p.add_argument("--api-key", default=None, help="bearer token, if the server requires one")
    p.add_argument("--json", default=None, metavar="OUT", help="write the baton.bench.serve/1 report here")
    p.add_argument(
        "--plots", default=None, metavar="DIR", help="write PNG plots here (default with --json: OUT's name + '_plots')"
    )
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--no-progress", action="store_true")


def _lanes(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for part in text.split(","):
        lane, eq, share = part.partition("=")
        if not eq or not lane.strip():
            raise ValueError(f"--lanes must be LANE=SHARE,..., got {text!r}")
        try:
            out[lane.strip()] = float(share)
        except ValueError:
            raise ValueError(f"--lanes: the share of {lane!r} must be a number, got {share!r}") from None
    total = sum(out.values())
    if total <= 0:
        raise ValueError("--lanes: shares must sum to more than 0")
    return {lane: s / total for lane, s in out.items()}  # normalized: 7,3 means 70/30


def config_from_args(args: argparse.Namespace):
    from baton.perf.loadgen.arrivals import Burst
    from baton.perf.loadgen.run_checks import check_non_negative, check_positive, check_request_count
    from baton.perf.loadgen.runner import RunConfig
    from baton.perf.loadgen.slo import resolve_slos
    from baton.perf.loadgen.workload import load_workload

    # RunConfig checks these too; here the errors name the flags.
    if args.rate is not None:
        check_positive("--rate", args.rate)
    if args.concurrency is not None and not 1 <= args.concurrency <= MAX_CONCURRENCY:
        raise ValueError(f"--concurrency must be between 1 and {MAX_CONCURRENCY}, got {args.concurrency}")
    check_positive("--duration", args.duration)
    if not 0 <= args.warmup < args.duration:  # (NaN fails too)
        raise ValueError(f"--warmup must be in [0, --duration), got {args.warmup}")
    check_positive("--timeout", args.timeout)
    if args.drain is not None:
        check_non_negative("--drain", args.drain)
    burst = Burst.parse(args.burst) if args.burst else None
    if burst is not None and args.rate is None:
        raise ValueError("--burst needs an open-loop --rate, not --concurrency")
    if args.rate is not None:  # the whole plan is built before the first request is sent
        check_request_count(args.rate, args.duration, burst)
    if args.gamma_shape is not None:
        check_positive("--gamma-shape", args.gamma_shape)
    _check_search_flags(args)
    spec = load_workload(args.workload)
    changes: dict = {}
    if args.lanes:
        changes["lanes"] = _lanes(args.lanes)
        changes["lane_input_len"] = {k: v for k, v in spec.lane_input_len.items() if k in changes["lanes"]}
        changes["lane_output_len"] = {k: v for k, v in spec.lane_output_len.items() if k in changes["lanes"]}
    if args.arrival:
        changes["arrival"] = args.arrival
    if args.gamma_shape is not None:
        changes["gamma_shape"] = args.gamma_shape
    spec = replace(spec, **changes) if changes else spec
    if args.gamma_shape is not None and spec.arrival != "gamma":  # it would be ignored
        raise ValueError(
            f"--gamma-shape is for gamma arrivals, but workload {spec.name} arrives {spec.arrival}: add --arrival gamma"
        )
    return RunConfig(
        url=args.url,
        spec=spec,
        duration_s=args.duration,
        rate=args.rate,
        concurrency=args.concurrency,
        protocol="grpc" if args.grpc else "http",
        metrics_url=args.metrics_url,
        burst=burst,
        seed=args.seed,
        warmup_s=args.warmup,
        slos=resolve_slos(tuple(spec.lanes), args.slo),
        timeout_s=args.timeout,
        drain_s=args.drain,
        api_key=args.api_key,
        progress=not args.no_progress,
    )


SEARCH_DEFAULTS = {"search_target": 0.9, "search_runs": 8, "search_tolerance": 0.1}
# Closed loop: one client task (and its request) per unit of concurrency, all at once.
MAX_CONCURRENCY = 100_000


def _check_search_flags(args: argparse.Namespace) -> None:
    """The --search-* flags: valid, and given only with --search (else they would be ignored)."""
    from baton.perf.loadgen.arrivals import Burst
    from baton.perf.loadgen.run_checks import check_positive, check_request_count

    given = [
        f"--{name.replace('_', '-')}"
        for name in (*SEARCH_DEFAULTS, "search_max_rate")
        if getattr(args, name) is not None
    ]
    if not args.search:
        if given:
            raise ValueError(f"{', '.join(given)} only appl{'y' if len(given) > 1 else 'ies'} with --search")
        return
    if args.rate is None:
        raise ValueError("--search needs --rate (the starting rate): it searches over open-loop rates")
    for name, value in SEARCH_DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if not 0 < args.search_target <= 1:
        raise ValueError(f"--search-target must be in (0, 1], got {args.search_target}")
    if args.search_runs < 1:
        raise ValueError(f"--search-runs must be >= 1, got {args.search_runs}")
    if not 0 < args.search_tolerance < 1:
        raise ValueError(
            f"--search-tolerance must be in (0, 1) (relative to the failing rate), got {args.search_tolerance}"
        )
    if args.search_max_rate is not None:
        check_positive("--search-max-rate", args.search_max_rate)
        if args.search_max_rate < args.rate:
            raise ValueError(f"--search-max-rate {args.search_max_rate:g} is below the starting --rate {args.rate:g}")
        check_request_count(
            args.search_max_rate,
            args.duration,
            Burst.parse(args.burst) if args.burst else None,
            rate_flag="--search-max-rate",
        )


def _search_rate_cap(args: argparse.Namespace) -> float:
    """--search-max-rate, or the highest rate whose run stays within MAX_PLANNED_REQUESTS."""
    from baton.perf.loadgen.arrivals import Burst
    from baton.perf.loadgen.run_checks import MAX_PLANNED_REQUESTS, expected_requests

    if args.search_max_rate is not None:
        return args.search_max_rate
    per_unit_rate = expected_requests(1.0, args.duration, Burst.parse(args.burst) if args.burst else None)
    return MAX_PLANNED_REQUESTS / per_unit_rate


def _check_plots_dir(path: str, flag: str = "--plots") -> None:
    """A directory ``write_plots`` can create (or write into): checked before the load run."""
    p = Path(path)
    if p.exists():
        if not p.is_dir():
            raise ValueError(f"{flag} {path}: exists and is not a directory")
        if not os.access(p, os.W_OK | os.X_OK):
            raise ValueError(f"{flag} {path}: not writable")
        return
    existing = next((a for a in p.resolve().parents if a.exists()), None)
    if existing is None or not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(f"{flag} {path}: cannot create it under {existing}")


def _check_report_path(path: str) -> None:
    p = Path(path)
    if p.is_dir():
        raise ValueError(f"--json {path}: is a directory, not a file")
    existing = next((a for a in p.resolve().parents if a.exists()), None)
    if existing is None or not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(f"--json {path}: cannot create it under {existing}")


def _say(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    from baton.perf.loadgen.report import format_summary, run_report, write_json
    from baton.perf.loadgen.runner import run_load_sync, with_rate
    from baton.perf.loadgen.search import search_goodput_rate

    if args.plots and args.no_plots:
        raise ValueError("--plots and --no-plots contradict each other: give one")
    cfg = config_from_args(args)
    if args.json:  # before the load run, not after it (its parent directories are created then)
        _check_report_path(args.json)
    plots_dir = (
        None
        if args.no_plots
        else args.plots or (str(Path(args.json).with_suffix("")) + "_plots" if args.json else None)
    )
    if plots_dir:
        _check_plots_dir(plots_dir, "--plots" if args.plots else "--plots (by default --json's name + '_plots')")
    search = None
    if args.search:

        def evaluate(rate: float):
            _say(f"search: running {cfg.duration_s:.0f} s at {rate:.3g} req/s")
            result = run_load_sync(with_rate(cfg, rate))
            att = result.summary().slo_attainment
            _say(f"search: {rate:.3g} req/s -> {'-' if att is None else f'{att:.0%}'} within SLOs")
            return att, result

        search = search_goodput_rate(
            evaluate,
            cfg.rate,
            target=args.search_target,
            max_runs=args.search_runs,
            rel_tol=args.search_tolerance,
            max_rate=_search_rate_cap(args),
        )
        shown = search.best or search.points[-1]
        result = shown.result
    else:
        result = run_load_sync(cfg)
    report = run_report(result, search)
    print(format_summary(report))
    if args.json:
        _say(f"report: {write_json(report, args.json)}")
    if plots_dir:
        from baton.perf.loadgen.plots import PlotsUnavailable, write_plots

        try:
            for path in write_plots(report, plots_dir):
                _say(f"plot: {path}")
        except PlotsUnavailable as e:
            _say(f"no plots: {e}")
    return 0
